#!/usr/bin/env bash
# Sets up this machine and runs every check: lint, types, unit, integration and e2e tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
npm run lint
npm run typecheck
npm test
