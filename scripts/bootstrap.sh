#!/usr/bin/env bash
# Create the lab's virtualenv (.venv) and install everything it needs: pyproject.toml's `dev` extra
# (the lab and its tests), every version as requirements.lock pins it. Safe to run again: it does
# nothing when requirements.lock, pyproject.toml and this script are unchanged.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=.venv
STAMP="$VENV/.servelab-installed"

say() { printf '[setup] %s\n' "$*" >&2; }

if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  say "Python 3.11 or newer is needed; '$PYTHON' is $("$PYTHON" --version 2>&1 || echo missing). Set PYTHON=/path/to/python3.11."
  exit 1
fi

# System libraries the pip-installed tools load. perf_analyzer needs libb64; Triton's Python
# backend stub embeds the system libpython of the venv's Python version.
py_version=$("$PYTHON" -c 'import sys; print(f"{sys.version_info.major}.{sys.version_info.minor}")')
missing=()
ldconfig -p 2>/dev/null | grep -q 'libb64\.so\.0d' || missing+=(libb64-0d)
ldconfig -p 2>/dev/null | grep -q "libpython${py_version}\.so\.1\.0" || missing+=("libpython${py_version}")
if [ ${#missing[@]} -gt 0 ]; then
  if command -v apt-get >/dev/null; then
    sudo_cmd=()
    [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo -n)
    say "installing system packages: ${missing[*]}"
    if ! { "${sudo_cmd[@]}" apt-get update -qq && "${sudo_cmd[@]}" apt-get install -y -qq "${missing[@]}" >/dev/null; }; then
      say "WARNING: could not install ${missing[*]} (no root or sudo without password?)."
      say "Run: sudo apt-get install -y ${missing[*]}   -- until then perf_analyzer and/or the local Triton will not start."
    fi
  else
    say "WARNING: ${missing[*]} missing and this is not a Debian/Ubuntu system; the local Triton and perf_analyzer need them (Linux only)."
  fi
fi

wanted=$(cat requirements.lock pyproject.toml scripts/bootstrap.sh | sha256sum | cut -d' ' -f1)
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$wanted" ] && [ -x "$VENV/bin/python" ]; then
  say "virtualenv $VENV is up to date"
  exit 0
fi

# A first install takes about 7 GB (PyTorch's CUDA build and its libraries, which run fine on a CPU).
# Said before pip starts, as pip says it only minutes later, as "[Errno 28] No space left on device".
if [ ! -x "$VENV/bin/python" ]; then
  free_gb=$(df -Pk . | awk 'NR == 2 { printf "%.1f", $4 / 1048576 }')
  if awk -v free="$free_gb" 'BEGIN { exit !(free < 8) }'; then
    say "WARNING: $free_gb GB free on the disk of $(pwd); a first install takes about 7 GB. If it fails with"
    say "'No space left on device', free space (docker system prune, old virtualenvs) and run make setup again."
  fi
  say "creating virtualenv $VENV with $("$PYTHON" --version)"
  "$PYTHON" -m venv "$VENV"
fi
say "installing Python packages into $VENV at requirements.lock's versions (the first time: a few minutes, about 7 GB)"
# --no-cache-dir: a copy of the downloaded CUDA libraries in pip's cache would take GBs more, for a
# reinstall that only a changed requirements.lock makes.
"$VENV/bin/python" -m pip install --disable-pip-version-check --no-cache-dir --progress-bar on \
  -c requirements.lock -e ".[dev]"
echo "$wanted" > "$STAMP"
say "virtualenv $VENV is ready"
