// Package version holds ebb's version, set at build time:
//
//	go build -ldflags "-X github.com/ebbdev/ebb/internal/version.Version=v0.1.0" ./cmd/ebb
//
// `make image` sets it to the image's tag.
package version

// Version is ebb's version ("dev" in a plain go build).
var Version = "dev"
