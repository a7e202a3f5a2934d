#!/usr/bin/env bash
# Create the lab's virtualenv (.venv) and install into it one of pyproject.toml's extras, every
# version as the lock pins it:
#
#   bash scripts/bootstrap.sh [lab|instructor|dev]    # dev when not given
#
# `lab` is the student's laptop (`make up`), `instructor` adds what notebooks 1-2 and `make notebooks`
# use, `dev` adds the tests' tools (`make test`); each extra holds the one before it, and a
# virtualenv that has a larger one is not changed for a smaller. PyTorch: on a machine without an
# NVIDIA GPU, its CPU builds from its own index (requirements-cpu.lock), where that index answers;
# else the registry's builds (requirements.lock: CUDA, which run on a CPU too). Safe to run again:
# it does nothing when the locks, pyproject.toml and this script are unchanged.
set -euo pipefail
cd "$(dirname "$0")/.."

EXTRA=${1:-dev}
PYTHON=${PYTHON:-python3}
VENV=.venv
STAMP="$VENV/.servelab-installed"
TORCH_CPU_INDEX=https://download.pytorch.org/whl/cpu
EXTRAS=(lab instructor dev)  # each holds the one before it (pyproject.toml)

say() { printf '[setup] %s\n' "$*" >&2; }

# First, before anything is created: the local lab runs Triton's server (the nvidia-pytriton wheel)
# and perf_analyzer (tritonclient's wheel), which exist for Linux x86_64 only; pip would fail on
# them minutes into the install, saying only that no version matches.
system=$(uname -s) machine=$(uname -m)
if [ "$system" != Linux ] || [ "$machine" != x86_64 ]; then
  say "This is $system $machine: the lab without Docker needs Linux x86_64, as its Triton server (the"
  say "nvidia-pytriton wheel) and perf_analyzer (tritonclient's wheel) are built for Linux x86_64 only."
  say "Run the lab in Docker instead, the same notebooks and services (docs/docker.md):"
  say "    docker compose up -d --build"
  exit 1
fi

rank() {
  local i
  for i in "${!EXTRAS[@]}"; do [ "${EXTRAS[$i]}" = "$1" ] && { echo "$i"; return; }; done
  return 1
}
rank "$EXTRA" >/dev/null || { say "unknown extra '$EXTRA': one of ${EXTRAS[*]}"; exit 2; }

if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  say "Python 3.11 or newer is needed; '$PYTHON' is $("$PYTHON" --version 2>&1 || echo missing). Set PYTHON=/path/to/python3.11."
  exit 1
fi

# System libraries the pip-installed tools load. perf_analyzer needs libb64; Triton's Python
# backend stub embeds the system libpython of the venv's Python version.
py_version=$("$PYTHON" -c 'import sys; print(f"{sys.version_info.major}.{sys.version_info.minor}")')
# The list is read whole first: under pipefail, `ldconfig -p | grep -q` fails whenever grep stops at
# its match while ldconfig still writes (killed by the closed pipe), and the packages were reinstalled.
libraries=$(ldconfig -p 2>/dev/null || true)
missing=()
grep 'libb64\.so\.0d' <<<"$libraries" >/dev/null || missing+=(libb64-0d)
grep "libpython${py_version}\.so\.1\.0" <<<"$libraries" >/dev/null || missing+=("libpython${py_version}")
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
    say "WARNING: ${missing[*]} missing and this is not a Debian/Ubuntu system; the local Triton and perf_analyzer need them."
  fi
fi

# The stamp: what was installed from (a digest of the locks, pyproject.toml and this script), which
# extra, and which lock. Up to date when the digest matches and the extra holds the one asked for.
wanted=$(cat requirements.lock requirements-cpu.lock pyproject.toml scripts/bootstrap.sh | sha256sum | cut -d' ' -f1)
read -r stamp_digest stamp_extra stamp_lock 2>/dev/null < "$STAMP" || true
if [ -x "$VENV/bin/python" ] && [ "${stamp_digest:-}" = "$wanted" ] \
  && [ "$(rank "${stamp_extra:-none}" || echo -1)" -ge "$(rank "$EXTRA")" ]; then
  say "virtualenv $VENV is up to date (the $stamp_extra extra, $stamp_lock)"
  exit 0
fi
# A virtualenv being brought up to date keeps the larger extra it had, all of it at the new versions.
if [ "$(rank "${stamp_extra:-none}" || echo -1)" -gt "$(rank "$EXTRA")" ]; then EXTRA=$stamp_extra; fi

# PyTorch's build. Its CPU build is a few hundred MB where the registry's is a CUDA build of several
# GB (with cuDNN, NCCL and the CUDA libraries). On a machine with an NVIDIA GPU, or where PyTorch's
# index cannot be reached (offline, a registry mirror only), the registry's.
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  lock=requirements.lock torch_from="the registry's CUDA builds (an NVIDIA GPU is here)"
elif "$PYTHON" -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=15)' "$TORCH_CPU_INDEX/torch/" 2>/dev/null; then
  lock=requirements-cpu.lock torch_from="its CPU builds from $TORCH_CPU_INDEX (no NVIDIA GPU here)"
else
  lock=requirements.lock
  torch_from="the registry's builds, CUDA ones that run on the CPU (about 5 GB more): no NVIDIA GPU here, but $TORCH_CPU_INDEX did not answer"
fi
say "PyTorch: $torch_from"

# The student's extra took 6.6 GB with the registry's builds (docs/local.md says how each was found).
size_gb=$([ "$lock" = requirements-cpu.lock ] && echo 2 || echo 7)
# Said before pip starts, as pip says it only minutes later, as "[Errno 28] No space left on device".
if [ ! -x "$VENV/bin/python" ]; then
  free_gb=$(df -Pk . | awk 'NR == 2 { printf "%.1f", $4 / 1048576 }')
  if awk -v free="$free_gb" -v need="$size_gb" 'BEGIN { exit !(free < need + 1) }'; then
    say "WARNING: $free_gb GB free on the disk of $(pwd); a first install takes about $size_gb GB. If it fails with"
    say "'No space left on device', free space (docker system prune, old virtualenvs) and run make setup again."
  fi
  say "creating virtualenv $VENV with $("$PYTHON" --version)"
  "$PYTHON" -m venv "$VENV"
fi
say "installing the $EXTRA extra into $VENV at $lock's versions (the first time: about 5 minutes on 2 cores, about $size_gb GB)"
pip=("$VENV/bin/python" -m pip install --disable-pip-version-check --no-cache-dir --progress-bar on)
# --no-cache-dir: a copy of the downloaded wheels in pip's cache would take GBs more, for a
# reinstall that only a changed lock makes.
if [ "$lock" = requirements-cpu.lock ]; then
  # PyTorch's two packages alone from its index (their dependencies come next, from the registry,
  # at the lock's versions): the lock names their CPU builds, torch==X+cpu.
  grep -E '^(torch|torchvision)==' requirements-cpu.lock > "$VENV/torch-cpu.txt"
  "${pip[@]}" --no-deps --index-url "$TORCH_CPU_INDEX" -r "$VENV/torch-cpu.txt"
fi
"${pip[@]}" -c "$lock" -e ".[$EXTRA]"
echo "$wanted $EXTRA $lock" > "$STAMP"
say "virtualenv $VENV is ready (the $EXTRA extra, $lock)"
