#!/usr/bin/env bash
# Prepares a new machine for Capsule: Debian packages, npm packages, the build, and a check that
# unprivileged bubblewrap works. Safe to run again; it installs only what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(uname -s)" != "Linux" ]; then
  echo "capsule setup: Capsule needs Linux (this is $(uname -s)). It is tested on Debian 12." >&2
  exit 1
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "capsule setup: run as root (Capsule sets up cgroups, mounts and namespaces; sandboxed code runs as an unprivileged uid)." >&2
  exit 1
fi

# Debian packages: the isolation tools, the C toolchain for the helpers, what the default sandbox
# image offers (Python with the IPython kernel and the data stack), and the browser the console's
# end-to-end test drives. chromium comes from bookworm-security and is not version-pinned: the
# archive keeps only its newest build, and a browser must take its security updates.
packages=(bubblewrap libseccomp-dev btrfs-progs gcc make iproute2 nftables uidmap procps
  python3 python3-ipykernel python3-jupyter-client python3-numpy python3-pandas python3-matplotlib
  inotify-tools hyperfine curl
  ripgrep socat  # ripgrep, socat: what Anthropic's srt (bench/cli.ts's peer) needs on Linux
  mmdebstrap skopeo umoci docker-registry apache2-utils  # templates; registry + htpasswd for tests
  chromium fonts-dejavu-core)  # the web console's browser test (playwright-core drives Debian's chromium)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "capsule setup: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# The docker-registry package starts a registry on all interfaces (:5000) where systemd runs.
# Capsule's tests start their own on 127.0.0.1 with a config of their own: keep the service off.
if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
  systemctl disable --now docker-registry >/dev/null 2>&1 || true
fi

# gVisor (the "gvisor" backend): runsc from bookworm-backports, whose 2024-07 build has the fast
# systrap platform; bookworm's own build (2022-12) has only ptrace (~10x slower syscalls). The
# backports source is added only when no backports source exists yet. If backports cannot be
# reached, bookworm's runsc is installed instead and Capsule runs it with --platform=ptrace.
if ! command -v runsc >/dev/null 2>&1; then
  export DEBIAN_FRONTEND=noninteractive
  # Backports from the same mirror as the host's bookworm source (read from its apt
  # configuration, one-line or deb822), added only when no backports source exists yet.
  if ! grep -rqs --include='*.list' --include='*.sources' 'bookworm-backports' /etc/apt/sources.list /etc/apt/sources.list.d/; then
    mirror=$(grep -hsE '^[[:space:]]*deb[[:space:]]' /etc/apt/sources.list /etc/apt/sources.list.d/*.list | sed -E 's/\[[^]]*\]//' | awk '$3 == "bookworm" { print $2; exit }' || true)
    if [ -z "$mirror" ]; then
      mirror=$(awk 'BEGIN { RS = "" } /Suites:[^\n]* bookworm( |\n|$)/ { if (match($0, /URIs:[ \t]*[^ \t\n]+/)) { s = substr($0, RSTART, RLENGTH); sub(/URIs:[ \t]*/, "", s); print s; exit } }' /etc/apt/sources.list.d/*.sources 2>/dev/null || true)
    fi
    if [ -n "$mirror" ]; then
      echo "deb $mirror bookworm-backports main" >/etc/apt/sources.list.d/capsule-backports.list
    else
      echo "capsule setup: no bookworm source in the host's apt configuration to take a mirror from; not adding backports" >&2
    fi
  fi
  apt-get update -q || true
  if ! apt-get install -y -q --no-install-recommends -t bookworm-backports runsc; then
    echo "capsule setup: bookworm-backports unreachable; installing bookworm's runsc (ptrace platform only)" >&2
    apt-get install -y -q --no-install-recommends runsc
  fi
fi

node_major=$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0)
if [ "$node_major" -lt 20 ]; then
  echo "capsule setup: Node.js 20 or newer is needed (found: $(node --version 2>/dev/null || echo none))." >&2
  exit 1
fi

if [ ! -d node_modules ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
  npm ci --no-audit --no-fund
fi
npm run build --silent

# The kernel must let an unprivileged uid make user namespaces, or bwrap cannot work as one.
if ! setpriv --reuid=65534 --regid=65534 --clear-groups bwrap --unshare-user --ro-bind / / true 2>/dev/null; then
  echo "capsule setup: unprivileged user namespaces are disabled; enable them (sysctl kernel.unprivileged_userns_clone=1 or user.max_user_namespaces)." >&2
  exit 1
fi
echo "capsule setup: ready" >&2
