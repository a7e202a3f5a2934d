#!/usr/bin/env bash
# `make test-docker`: the lab's Compose project, for real, in its CPU variant.
#
#  1. a Docker engine with Compose v2: the running one, or one installed and started here
#     (scripts/docker_engine.sh), stopped again at the end if this run started it;
#  2. the base images: pulled, or local stand-ins where a registry cannot be reached
#     (scripts/docker_bases.sh);
#  3. every image built from the project's own Dockerfiles (pip's downloads in BuildKit's cache,
#     so a second run rebuilds nothing that did not change), the model files among them, in the
#     lab's PyTorch image (no image copies a model file of this clone's); the project brought up,
#     every health check waited for;
#  4. in the Jupyter container, quick profile, against the containers: the notebooks whose lessons
#     meet a server that differs there (below, each with what it adds), by `pytest --nbmake`, every
#     verdict checked against its own tables by the notebook's `lab.verdicts()`, and
#     tests/test_compose.py, which checks in seconds what notebooks 4, 6, 7 and 9 do differently there
#     (each notebook runs once in `make test`, against the local stack); a failure is reported by
#     its cell's source and traceback (nbmake), in this log;
#  5. a photo uploaded to GourmetGram through its published port, which answers with a class;
#  6. a service container killed, and checked to come back healthy (Docker's restart policy);
#  7. everything torn down, and checked: no container, network or volume of the project is left.
#
# The project is named servelab-check and publishes free ports, so it never touches a project or
# a `make up` of your own. Each step says what it does on stderr; the last lines give the times.
#
# With --build-only (`make docker-build`), steps 1-3's engine, base images and builds only: CI runs
# it in the background while `make test` runs, and leaves the engine running for this script.
set -euo pipefail
cd "$(dirname "$0")/.."

PROJECT=servelab-check
# What each notebook adds in the containers, beyond its run in `make test`:
#  3: the FastAPI services and a GourmetGram of the notebook's reached by service name, not 127.0.0.1;
#  5: Triton's own image: the repository staged at its start in the volume it shares with Jupyter,
#     a config changed from another container, Triton's log read through that volume.
# Not here: 4 (the same services, out of this container's sight), 6 to 9 (what their lessons do
# differently in the containers, checked in seconds by tests/test_compose.py: perf_analyzer and
# instances (6), photos fetched from the image host by its service name (7), Ray Serve's container
# (8), cancels delivered to Triton's container over gRPC and a stream's steps counted from its log
# in the shared volume (9); each measured its lesson here again for minutes), 10 (its paths there,
# a config applied and Triton's log read through the volume, gRPC to Triton by name, are 5's and
# 9's), and the appendix (it probes Triton 2.51's crash, the release `make test` runs too; here
# Docker's restart brings Triton back, which step 6 checks).
NOTEBOOKS=(3_fastapi.ipynb 5_triton.ipynb)
PY=.venv/bin/python
DOCKERD_PID=.lab/docker/dockerd.pid
build_only=0
[ "${1:-}" = "--build-only" ] && build_only=1

say() { printf '[test-docker %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
started=$(date +%s)
phases=()
phase() { phases+=("$1: $(($(date +%s) - phase_start)) s"); phase_start=$(date +%s); }
phase_start=$started

bash scripts/docker_engine.sh
phase "engine"

# compose.yaml alone, the CPU variant, whatever a .env in the clone names (COMPOSE_FILE).
compose() { docker compose -p "$PROJECT" -f compose.yaml "$@"; }

teardown() {
  local status=$?
  say "tearing the project down"
  compose down --volumes --remove-orphans --timeout 30 >/dev/null 2>&1 || true
  local left
  left=$(
    docker ps -aq --filter "label=com.docker.compose.project=$PROJECT"
    docker network ls -q --filter "label=com.docker.compose.project=$PROJECT"
    docker volume ls -q --filter "label=com.docker.compose.project=$PROJECT"
  )
  if [ -n "$left" ]; then
    say "FAILED: the project left containers, networks or volumes behind: $(echo "$left" | tr '\n' ' ')"
    status=1
  else
    say "nothing of the project is left: no container, network or volume"
  fi
  # The engine scripts/docker_engine.sh started (this run, or `make docker-build` before it); one
  # that was running already, of the machine's own, is left running.
  if [ -f "$DOCKERD_PID" ] && grep -qs dockerd "/proc/$(cat "$DOCKERD_PID")/cmdline"; then
    say "stopping the Docker engine the lab's scripts started"
    kill "$(cat "$DOCKERD_PID")" 2>/dev/null || true
    for _ in $(seq 30); do kill -0 "$(cat "$DOCKERD_PID")" 2>/dev/null || break; sleep 1; done
    rm -f "$DOCKERD_PID"
  fi
  phase "teardown"
  say "times: ${phases[*]}; total $(($(date +%s) - started)) s"
  if [ "$status" -eq 0 ]; then say "PASSED"; else say "FAILED (exit $status)"; fi
  exit "$status"
}
if [ "$build_only" -eq 1 ]; then
  trap 'status=$?; say "build only: times: ${phases[*]}; total $(($(date +%s) - started)) s (exit $status)"' EXIT
else
  trap teardown EXIT
fi

bash scripts/docker_bases.sh
phase "base images"

# Free ports for every published service (SERVELAB_PORT_<NAME>, as compose.yaml reads them).
eval "$("$PY" -c 'from dataclasses import asdict
from servelab.stack.supervision import Ports
for name, port in asdict(Ports.found_free()).items(): print(f"export SERVELAB_PORT_{name.upper()}={port}")')"

# PyTorch's CPU wheels come from its own index (compose.yaml); where that index cannot
# be reached, from pip's own index, whose build of torch runs on a CPU too (larger).
torch_index=$(compose config --format json | "$PY" -c 'import json, sys
print(json.load(sys.stdin)["services"]["torch"]["build"]["args"]["TORCH_INDEX_URL"])')
if [ -n "$torch_index" ] && ! curl -fsS --max-time 20 -o /dev/null "$torch_index/"; then
  say "PyTorch's CPU wheel index cannot be reached: PyTorch comes from pip's own index"
  export TORCH_INDEX_URL=
fi

say "building every image (BuildKit; pip's cache kept between builds)"
compose build
phase "build"
if [ "$build_only" -eq 1 ]; then
  say "every image is built; the engine keeps running for \`make test-docker\`"
  exit 0
fi

say "starting the project and waiting for every health check"
compose up -d --wait --wait-timeout 900
compose ps --format '{{.Service}}: {{.Status}}' >&2
phase "up"

say "running notebooks ${NOTEBOOKS[*]} and tests/test_compose.py in the Jupyter container (pytest, quick profile)"
# The runs and the notebooks' own services go to folders in the container, not into the clone, and
# so does nothing of pytest's: the clone is mounted, and its owner may not be the container's user
# (no cache folder; the root conftest.py starts no server with the Compose project's LAB_SERVICES).
compose exec -T -e LAB_PROFILE=quick -e SERVELAB_RESULTS_DIR=/tmp/servelab-check/results \
  -e SERVELAB_DIR=/tmp/servelab-check/lab jupyter python -m pytest --nbmake -p no:cacheprovider -v \
  --durations=0 "${NOTEBOOKS[@]/#/notebooks/}" tests/test_compose.py
phase "notebooks"

say "uploading a sample photo to GourmetGram through its published port"
"$PY" - <<EOF
from servelab import paths
from servelab.lab.facade import ui

url = "http://127.0.0.1:$SERVELAB_PORT_GOURMETGRAM"
answer = ui.upload(url, paths.SAMPLE_IMAGE.name, paths.SAMPLE_IMAGE.read_bytes())
print(f"GourmetGram at {url}: HTTP {answer.status}, {answer}")
assert answer.status == 200 and answer.label, f"GourmetGram gave no class: {answer}"
EOF
phase "GourmetGram"

container=$(compose ps -q fastapi_onnx)
if [ "$(id -u)" -eq 0 ]; then
  # A crash: `docker kill` would count as stopping it by hand, which restart: unless-stopped obeys.
  say "killing fastapi_onnx's server process, as a crash would, and waiting for Docker to restart it"
  restarts_before=$(docker inspect -f '{{.RestartCount}}' "$container")
  # The container's PID 1 is Docker's init (compose.yaml: init: true); the server is its child.
  server=$(pgrep -P "$(docker inspect -f '{{.State.Pid}}' "$container")")
  kill -9 "$server"
else
  say "restarting fastapi_onnx's container (only root can kill its process as a crash would)"
  restarts_before=-1
  compose restart fastapi_onnx
fi
for _ in $(seq 180); do
  health=$(docker inspect -f '{{.RestartCount}} {{.State.Health.Status}}' "$container")
  [ "${health%% *}" -gt "$restarts_before" ] && [ "${health#* }" = healthy ] && break
  sleep 1
done
[ "${health#* }" = healthy ] || { say "FAILED: fastapi_onnx did not come back healthy ($health)"; exit 1; }
"$PY" - <<EOF
import base64

import requests

from servelab import paths

url = "http://127.0.0.1:$SERVELAB_PORT_FASTAPI_ONNX/predict"
answer = requests.post(url, json={"image": base64.b64encode(paths.SAMPLE_IMAGE.read_bytes()).decode()}, timeout=60)
answer.raise_for_status()
print(f"fastapi_onnx restarted by Docker ({'$health'.split()[0]} restart(s)), healthy, and answers: {answer.json()}")
EOF
phase "restart"
