#!/usr/bin/env bash
# The CSV scenario of the README, end to end, through `capsule run`: the sample files are
# readable but not writable, the output directory is collected, tests run under a time limit,
# there is no network and no secret.
set -uo pipefail
cd "$(dirname "$0")/.."
capsule() { bin/capsule "$@"; }
in=examples/csv-demo/input
out=$(mktemp -d /tmp/capsule-demo-out-XXXX)

step() { printf '\n\033[1m== %s\033[0m\n$ %s\n' "$1" "$2"; }

step "1. Run the buggy converter (it fails on the data; Capsule reports the program's own failure)" \
  "capsule run --input $in -- python3 /input/convert.py /input/sales.csv /workspace/out.json"
capsule run --input "$in" --timeout 10s -- python3 /input/convert.py /input/sales.csv /workspace/out.json
echo "(exit status $?)"

step "2. The inputs are read-only, there is no network, and the host's secrets are not there" \
  "capsule run --input $in -- sh -c '...'"
CAPSULE_DEMO_SECRET=host-only capsule run --input "$in" -- sh -c \
  'echo x >> /input/sales.csv || true; cat /proc/net/dev | tail -n +3 | cut -d: -f1; env | grep -c CAPSULE_DEMO_SECRET || true'

step "3. Run the tests with the fix, under a 10 s limit, collecting /workspace/output" \
  "capsule run --input $in --output $out --timeout 10s --json -- python3 /input/test_convert.py"
capsule run --input "$in" --output "$out" --timeout 10s --memory 256MiB --json -- python3 /input/test_convert.py
echo "collected: $(ls "$out")"; cat "$out/sales.json"; echo

step "4. A runaway test is ended by the wall clock with a readable error" \
  "capsule run --timeout 2s -- python3 -c 'while True: pass'"
capsule run --timeout 2s -- python3 -c 'while True: pass'
echo "(exit status $? = wall-clock limit)"
rm -rf "$out"
