#!/usr/bin/env bash
# failures.sh LOG: prints, from the output of `go test -v` in LOG, why each
# package failed, so that the end of a long run (all CI shows) says it:
# what each failed test logged (its indented lines, the last 40), a panic
# (a -timeout among them) with the 20 lines after it, and, for a package
# that failed with no test failed (TestMain, the cluster's set-up), its last
# 40 lines.
set -euo pipefail
log=$1
awk '
	function keep(line) { tail[ntail % 40] = line; ntail++ }
	function flushtail(   i, start) {
		start = ntail > 40 ? ntail - 40 : 0
		for (i = start; i < ntail; i++) print tail[i % 40]
	}
	function reset() { delete n; delete lines; ntail = 0; failedtests = 0; pkgpanic = 0; panicking = 0; cur = "" }
	/^FAIL[ \t]+[^ \t]+([ \t]|$)/ {
		if (failedtests == 0 && !pkgpanic) {
			print "=== package " $2 " failed with no test failed; its last 40 lines:"
			flushtail()
		}
		packages++
		reset(); next
	}
	/^ok[ \t]/ { reset(); next }
	panicking > 0 { print; panicking--; keep($0); next }
	/^panic: / {
		print "=== a panic (the 20 lines after it):"; print; panicking = 20; panics++; pkgpanic = 1; keep($0); next
	}
	# Subtests log under their top-level test.
	/^=== (RUN|CONT|NAME|PAUSE) / { cur = $3; sub(/\/.*/, "", cur); keep($0); next }
	/^--- FAIL: / {
		name = $3
		print "=== why " name " failed (" n[name]+0 " line(s) it logged; the last 40):"
		start = n[name] > 40 ? n[name] - 40 : 0
		for (i = start; i < n[name]; i++) print lines[name, i]
		failedtests++; failed++
		keep($0); next
	}
	/^    / && cur != "" { lines[cur, n[cur]++] = $0 }
	{ keep($0) }
	END { print "=== " failed+0 " test(s) and " packages+0 " package(s) failed, " panics+0 " panic(s)" }
' "$log"
