#!/usr/bin/env bash
# The base images the project's Dockerfiles start FROM, for `make test-docker`: each one that is
# not here already is pulled from its registry; where the registry cannot be reached, a local
# stand-in is built and tagged with the real name, so that the Dockerfiles build unchanged.
#
# A stand-in starts from a Debian 12 root file system made with debootstrap from the Debian mirror
# this machine's apt uses, imported with `docker import`. It gets this machine's trust store and
# global pip settings, so that builds on it install from the same package registries the host
# reaches. docker/standins/ holds one Dockerfile per base, each saying what it reproduces of the
# real image and what it does not. A stand-in is rebuilt when its Dockerfile changes.
set -euo pipefail
cd "$(dirname "$0")/.."

ROOTFS_IMAGE=servelab-standin/debian:bookworm
PULL_TIMEOUT_S=${PULL_TIMEOUT_S:-90}
say() { printf '[bases] %s\n' "$*" >&2; }

# Each base the Dockerfiles name, and the stand-in Dockerfile for it.
standin_for() {
  case "$1" in
    python:3.11-slim-bookworm) echo docker/standins/python-slim.Dockerfile ;;
    nvcr.io/nvidia/tritonserver:*) echo docker/standins/tritonserver.Dockerfile ;;
    *) return 1 ;;
  esac
}

build_rootfs_image() {
  docker image inspect "$ROOTFS_IMAGE" >/dev/null 2>&1 && return
  if ! command -v debootstrap >/dev/null; then
    say "installing debootstrap (Debian's package)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null \
      || { say "could not install debootstrap (this needs root), which the stand-ins are built with"; exit 1; }
  fi
  local mirror root
  mirror=$(bash scripts/debian_mirror.sh)
  [ -n "$mirror" ] || { say "no Debian mirror found in this machine's apt sources"; exit 1; }
  root=$(mktemp -d)
  say "debootstrap: a Debian 12 root file system from this machine's Debian mirror (about a minute)"
  debootstrap --variant=minbase \
    --include=python3,python3-pip,python3-venv,python-is-python3,libpython3.11,ca-certificates,procps \
    bookworm "$root" "$mirror" >/dev/null
  # The trust store and global pip settings of this machine, so that builds on the stand-in reach
  # the registries the way the host does.
  cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
  if [ -f /etc/pip.conf ]; then cp /etc/pip.conf "$root/etc/pip.conf"; fi
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
  tar -C "$root" -c . | docker import - "$ROOTFS_IMAGE" >/dev/null
  rm -rf "$root"
}

# The bases come from a registry, named with a tag; a FROM without one names a stage of the same
# Dockerfile or the lab's own PyTorch image (servelab-torch), which Compose builds.
for base in $(grep -h '^FROM ' docker/Dockerfile.* ./*/Dockerfile | awk '{print $2}' | grep ':' | sort -u); do
  standin=$(standin_for "$base") || { say "no stand-in is known for $base"; standin=""; }
  want=""
  if [ -n "$standin" ]; then want=$(sha256sum "$standin" | cut -c1-16); fi
  have=$(docker image inspect --format '{{index .Config.Labels "servelab.standin"}}' "$base" 2>/dev/null || true)
  if docker image inspect "$base" >/dev/null 2>&1 && { [ -z "$have" ] || [ "$have" = "$want" ]; }; then
    say "$base: here${have:+ (a stand-in)}"
    continue
  fi
  if [ -z "$have" ] && timeout "$PULL_TIMEOUT_S" docker pull -q "$base" >/dev/null 2>&1; then
    say "$base: pulled from its registry"
    continue
  fi
  [ -n "$standin" ] || { say "$base cannot be pulled and has no stand-in"; exit 1; }
  if [ -n "$have" ]; then
    say "$base: its stand-in is out of date; building it again ($standin)"
  else
    say "$base: its registry cannot be reached; building the local stand-in ($standin)"
  fi
  build_rootfs_image
  # The classic builder: the docker CLI may lack the buildx plugin (Debian has none), and a
  # stand-in needs no BuildKit feature. Its output is shown only when the build fails.
  log=$(mktemp)
  if ! DOCKER_BUILDKIT=0 docker build --network host --build-arg "ROOTFS=$ROOTFS_IMAGE" \
      --label "servelab.standin=$want" -t "$base" -f "$standin" docker/standins >"$log" 2>&1; then
    tail -n 30 "$log" >&2
    say "building the stand-in for $base failed (above)"
    exit 1
  fi
  rm -f "$log"
done
