#!/usr/bin/env bash
# The soak (issue 16): N create → exec → kill cycles against a `capsule serve` of its own, then
# a check that nothing is left — no process, cgroup, network namespace, mount or subvolume of
# its instance, the server's file descriptors back where they were, its RSS and JS heap flat (each
# sample after a full GC, through the server's inspector, opened on 127.0.0.1 for the run: any
# local user can reach an inspector, so run the soak on a machine of your own). Prints one
# PASS/FAIL line per check and a closing PASS or FAIL; exit status 0 pass, 1 fail, 2 out of time.
#
#   scripts/soak.sh [--cycles 10000] [--concurrency 8] [--network-every 10] [--max-minutes 90] [--json]
#
# Bounded in count (--cycles) and time (--max-minutes). Needs a prepared machine (scripts/setup.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
npm run build --silent
exec node dist/bench/soak.js "$@"
