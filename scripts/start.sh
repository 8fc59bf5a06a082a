#!/usr/bin/env bash
# The main job on a new machine: set up, show the CSV demo through `capsule run`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/demo.sh
