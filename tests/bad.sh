#!/bin/bash
# Bad-input corpus runner: every tests/bad/*.net carries its expected
# diagnostic on its first line,
#     # expect: 12:7: error: unknown layer 'conv2'
# and must make `mgc FILE --emit=kernels` (the front end, the passes and
# codegen) exit with status 1 and print
# "FILE:12:7: error: unknown layer 'conv2'" (a substring of stderr), with no
# crash and no sanitizer report.
#   bash tests/bad.sh              uses ./mgc, run from the repository root
#   MGC=path/to/mgc bash tests/bad.sh
#   bash tests/bad.sh -v           also prints each failure's stderr
cd "$(dirname "$0")/.." || exit 2
MGC=${MGC:-./mgc}
verbose=0
[ "$1" = "-v" ] && verbose=1
if [ ! -x "$MGC" ]; then
    echo "tests/bad.sh: no executable '$MGC' (run make first)" >&2
    exit 2
fi
pass=0 fail=0
for f in tests/bad/*.net; do
    expect=$(head -n 1 "$f" | sed -n 's/^# expect: //p')
    if [ -z "$expect" ]; then
        echo "FAIL $f: no '# expect: ' comment on its first line"
        fail=$((fail + 1))
        continue
    fi
    err=$(ASAN_OPTIONS=detect_leaks=0 timeout 20 "$MGC" "$f" --emit=kernels 2>&1 >/dev/null)
    rc=$?
    why=""
    if [ $rc -ne 1 ]; then why="exit status $rc, expected 1"
    elif grep -qE 'Sanitizer|runtime error:|Assertion' <<<"$err"; then why="sanitizer report"
    elif ! grep -qF -- "$f:$expect" <<<"$err"; then why="missing '$f:$expect'"
    fi
    if [ -n "$why" ]; then
        echo "FAIL $f: $why"
        [ $verbose = 1 ] && sed 's/^/    | /' <<<"$err" | head -20
        fail=$((fail + 1))
    else
        pass=$((pass + 1))
    fi
done
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
