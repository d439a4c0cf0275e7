#!/usr/bin/env bash
# Where the test suite's CPU time goes, by program (gcc's cc1, python, the harnesses, qemu, ...):
# runs `make test`'s pytest command under Linux process accounting and prints `sa`'s table of
# CPU minutes per command name. Needs root and the acct package (apt-get install acct); turns
# accounting off again on exit. Run it on a quiet machine:
#
#     sudo scripts/suite_cpu_profile.sh                 # the whole suite
#     sudo scripts/suite_cpu_profile.sh tests/test_prepacked.py
set -euo pipefail
cd "$(dirname "$0")/.."
command -v accton >/dev/null && command -v sa >/dev/null || {
    echo "suite_cpu_profile: needs accton and sa (apt-get install acct)" >&2; exit 3; }
log=$(mktemp)   # the accounting file, removed on exit
trap 'accton off >/dev/null 2>&1 || true; rm -f "$log"' EXIT
accton "$log" >/dev/null
status=0
.venv/bin/python -m pytest -n 2 -q -p no:cacheprovider "${@:-tests}" || status=$?
accton off >/dev/null
echo "CPU by program (cp = CPU minutes, re = real minutes):"
sa -a -c "$log" | head -25
exit $status
