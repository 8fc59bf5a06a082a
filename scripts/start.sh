#!/usr/bin/env bash
# The main job on a new machine: set up, then run `capsule serve` on its embedded defaults
# (127.0.0.1:7070, data in /var/lib/capsule). It prints its URL, an API key (taken from
# CAPSULE_API_KEY, or generated and shown once) and a one-time console login URL. Ctrl-C stops
# it and removes every sandbox.
# `bash scripts/demo.sh` shows the one-shot `capsule run` scenario from the README instead.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec node bin/capsule.js serve "$@"
