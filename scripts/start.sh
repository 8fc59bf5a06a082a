#!/usr/bin/env bash
# The main job on a new machine: set up, then run `capsule serve` on its embedded defaults
# (127.0.0.1:7070, data in /var/lib/capsule). It prints its URL, an API key (taken from
# CAPSULE_API_KEY, or generated and shown once) and a one-time console login URL. Ctrl-C stops
# it and removes every sandbox.
#
# The first start also bootstraps the default template, `base` (Debian from the host's apt
# sources with python3, nodejs and git; a few minutes, its progress shown), which sandboxes start
# from unless they name another. If that cannot be made (no reachable Debian mirror), the server
# starts on the `host` template instead and says so.
# `bash scripts/demo.sh` shows the one-shot `capsule run` scenario from the README instead.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
default_template=base
if ! env -u CAPSULE_URL node bin/capsule.js template inspect base >/dev/null 2>&1; then
  echo "capsule: making the default template 'base' (first start only; a few minutes)" >&2
  if ! env -u CAPSULE_URL node bin/capsule.js template bootstrap debian -t base --packages python3,nodejs,git --progress; then
    echo "capsule: the default template could not be made; sandboxes start from the host template (retry: capsule template bootstrap debian -t base)" >&2
    default_template=host
  fi
fi
exec node bin/capsule.js serve --default-template "$default_template" "$@"
