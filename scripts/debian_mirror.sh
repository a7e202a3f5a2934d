#!/usr/bin/env bash
# Prints the Debian mirror this machine's apt uses (deb822 or one-line sources), never a name
# written here: the stand-in bases (docker_bases.sh) and the Docker engine (docker_engine.sh) are
# fetched from it.
set -euo pipefail
cat /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null \
  | awk '/^URIs:/ || /^deb / {print $2}' | grep -v security | head -n 1 || true
