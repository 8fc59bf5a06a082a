#!/usr/bin/env bash
# Soaks the test suite for flakes: on a fresh clone of this checkout's HEAD (committed work only),
# prepared by scripts/setup.sh as a new machine would be, it runs the unit tier N times and then
# the full suite M times, stopping at the first failure and keeping that run's log.
#
#   scripts/soak-tests.sh N [M]     N unit runs (default 50), M full runs (default 3; 0 skips them)
#
# Prints one line per run and a closing "N passed, 0 failed" line. Exit status 1 names the failed
# run and the log that holds it; the clone is removed unless something failed (then it is kept
# for a look) or SOAK_KEEP=1.
set -euo pipefail
cd "$(dirname "$0")/.."

units=${1:-50}
fulls=${2:-3}
for n in "$units" "$fulls"; do
  if ! [[ "$n" =~ ^[0-9]+$ ]]; then
    echo "usage: scripts/soak-tests.sh N [M]   (N unit runs, M full-suite runs; whole numbers)" >&2
    exit 2
  fi
done

source_dir=$(pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/capsule-soak-XXXXXX")
logs="$work/logs"
clone="$work/capsule"
mkdir -p "$logs"
keep=${SOAK_KEEP:-0}
cleanup() { if [ "$keep" != 1 ]; then rm -rf "$work"; fi; }
trap cleanup EXIT

echo "soak: cloning $(git rev-parse --short HEAD) into $clone" >&2
git clone --quiet --no-hardlinks "$source_dir" "$clone"
cd "$clone"
if ! bash scripts/setup.sh >"$logs/setup.log" 2>&1; then
  keep=1
  echo "soak: scripts/setup.sh failed on the fresh clone; log: $logs/setup.log" >&2
  tail -n 30 "$logs/setup.log" >&2
  exit 1
fi

passed=0
# run NAME LOG -- COMMAND...: one run; on failure prints where and stops the soak.
run() {
  local name=$1 log=$2
  shift 3
  local started=$SECONDS
  if "$@" >"$log" 2>&1; then
    passed=$((passed + 1))
    echo "soak: $name ok ($((SECONDS - started)) s)"
  else
    keep=1
    echo "soak: $name FAILED after $passed passing runs; its log: $log" >&2
    grep -E 'FAIL|AssertionError|Error:' "$log" | head -n 20 >&2 || true
    echo "$passed passed, 1 failed"
    exit 1
  fi
}

for i in $(seq 1 "$units"); do
  run "unit run $i/$units" "$logs/unit-$i.log" -- npx vitest run test/unit
done
for i in $(seq 1 "$fulls"); do
  run "full run $i/$fulls" "$logs/full-$i.log" -- npx vitest run
done
echo "$passed passed, 0 failed"
