module github.com/ebbdev/ebb/hack/tools/pause

go 1.26.0
