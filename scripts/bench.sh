#!/usr/bin/env bash
# Runs every benchmark in bench/ in turn — each compares Capsule with its peers in the same run —
# and keeps each one's output under bench-results/. Needs a prepared machine (scripts/setup.sh).
# Extra arguments (e.g. --json) go to every benchmark.
set -euo pipefail
cd "$(dirname "$0")/.."
npm run build --silent
# Peers installed apart from Capsule's tree (bench/peers/package.json says why).
if [ ! -d bench/peers/node_modules ]; then npm ci --prefix bench/peers --no-audit --no-fund; fi
mkdir -p bench-results
for bench in cli isolation sdk-lifecycle e2b interpreter egress gvisor artifacts templates reach snapshots load; do
  echo "== bench/$bench.ts"
  node "dist/bench/$bench.js" "$@" | tee "bench-results/$bench.txt"
done
