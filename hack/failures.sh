#!/usr/bin/env bash
# failures.sh LOG: prints, from the output of `go test -v` in LOG, what each
# failed test logged (its lines from "=== RUN" to "--- FAIL", the last 40 of
# each), so that the end of a long run (all CI shows) says why it failed.
set -euo pipefail
log=$1
awk '
	# Subtests log under their top-level test.
	/^=== (RUN|CONT|NAME|PAUSE) / { cur = $3; sub(/\/.*/, "", cur); next }
	/^--- FAIL: / {
		name = $3
		print "=== why " name " failed (" n[name]+0 " line(s) it logged; the last 40):"
		start = n[name] > 40 ? n[name] - 40 : 0
		for (i = start; i < n[name]; i++) print lines[name, i]
		failed++
		next
	}
	/^    / && cur != "" { lines[cur, n[cur]++] = $0 }
	END { if (failed) print "=== " failed " test(s) failed" }
' "$log"
