#!/usr/bin/env bash
# What `make test-gpu` needs on a bare GPU machine, downloaded here (it needs internet) into .lab/wheels
# (git-ignored, with the rest of .lab). Such a machine has torch, ONNX Runtime, numpy, Pillow, httpx,
# aiohttp, anyio, h11, click, prometheus-client, grpcio and pyyaml already (shared/ENVIRONMENT.md, "A bare
# GPU machine"). The versions are the lock's (requirements.lock), those the tests run with; the wheels are
# for Python 3.12 on x86_64 Linux (PYTHON_VERSION=3.11 for another).
# - The services: FastAPI, uvicorn and what they import that such a machine lacks (fastapi 0.165 imports
#   opentelemetry at import time, so its API package travels too). About 3 MB.
# - Triton's row: triton-server.tar.xz holds the nvidia-pytriton wheel's server (its binary, the Python
#   backend with this Python's stub alone, its libraries but the libpython the 3.13 stub needs) and
#   tritonclient's Python package (the lab's Triton tooling reads model configs with it; its wheel's
#   perf_analyzer stays behind), with python-rapidjson and protobuf beside the wheels. About 27 MB, so the
#   whole working tree, model files included, stays within what a copy to such a machine takes (64 MiB).
# - .lab/triton-numpy: numpy 1.x for Triton's model alone (the wheel's Python backend misreads its inputs
#   under numpy 2, which such a machine has), 18 MB in a folder of its own: with it the copy exceeds 64 MiB,
#   so a run that takes it leaves the ONNX model behind (`--services triton`; servelab/bench/gpu_check says how).
# There, in the repository root:
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .lab/wheels/*.whl
#   tar -xJf .lab/wheels/triton-server.tar.xz -C /tmp/site
#   PYTHONPATH=/tmp/site make test-gpu
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON_VERSION=${PYTHON_VERSION:-3.12}
WHEELS=(
  fastapi
  starlette
  pydantic
  pydantic-core
  annotated-types
  annotated-doc
  typing-inspection
  typing-extensions
  uvicorn
  opentelemetry-api
  python-rapidjson
  protobuf
)
# pip matches a manylinux tag exactly: these cover the wheels above (nvidia-pytriton is 2_35).
PLATFORMS=(manylinux1_x86_64 manylinux2014_x86_64 manylinux_2_17_x86_64 manylinux_2_24_x86_64 manylinux_2_28_x86_64 manylinux_2_31_x86_64 manylinux_2_34_x86_64 manylinux_2_35_x86_64)

download() {  # download DEST PACKAGE...: the lock's versions of PACKAGE..., no dependencies
  local dest=$1
  shift
  python3 -m pip download --quiet --no-deps --only-binary=:all: --dest "$dest" -c requirements.lock \
    --python-version "$PYTHON_VERSION" --implementation cp "${PLATFORMS[@]/#/--platform=}" "$@"
}

rm -rf .lab/wheels .lab/triton-numpy
download .lab/wheels "${WHEELS[@]}"
download .lab/triton-numpy numpy

unpacked=$(mktemp -d)
trap 'rm -rf "$unpacked"' EXIT
download "$unpacked/dist" nvidia-pytriton tritonclient
python3 -m zipfile -e "$unpacked"/dist/nvidia_pytriton-*.whl "$unpacked/site"
python3 -m zipfile -e "$unpacked"/dist/tritonclient-*.whl "$unpacked/tritonclient"
mv "$unpacked"/tritonclient/tritonclient-*.data/purelib/tritonclient "$unpacked/site/"  # its package, no binaries
stubs="$unpacked/site/pytriton/tritonserver/python_backend_stubs"
find "$stubs" -mindepth 1 -maxdepth 1 ! -name "$PYTHON_VERSION" -exec rm -rf {} +
rm -f "$unpacked"/site/nvidia_pytriton.libs/libpython3-*
chmod +x "$unpacked/site/pytriton/tritonserver/bin/tritonserver" "$stubs/$PYTHON_VERSION/triton_python_backend_stub"
tar -cJf .lab/wheels/triton-server.tar.xz -C "$unpacked/site" pytriton/tritonserver nvidia_pytriton.libs tritonclient
ls -l .lab/wheels .lab/triton-numpy
du -sh .lab/wheels .lab/triton-numpy
