#!/bin/sh
# The GPU build's first step (docker/Dockerfile.torch, with docker/compose.gpu.yaml): on a machine
# without an NVIDIA GPU, stop before PyTorch's CUDA build is downloaded, and say how to run the lab
# on the CPU instead: compose.yaml alone.
# A build step sees the machine's PCI devices in sysfs (SYSFS, /sys by default; the tests point it
# at a folder of their own). A GPU that sysfs does not list (WSL 2 passes one through otherwise), or
# a build meant for another machine, goes on with GPU_BUILD_WITHOUT_GPU=1.
set -eu
sysfs="${SYSFS:-/sys}"
for device in "$sysfs"/bus/pci/devices/*; do
    [ "$(cat "$device/vendor" 2>/dev/null)" = 0x10de ] || continue
    case "$(cat "$device/class" 2>/dev/null)" in
        0x03*) exit 0 ;;  # a display or 3D controller of NVIDIA's
    esac
done
if [ -n "${GPU_BUILD_WITHOUT_GPU:-}" ]; then
    echo "No NVIDIA GPU in $sysfs/bus/pci: building the GPU images all the same (GPU_BUILD_WITHOUT_GPU)." >&2
    exit 0
fi
cat >&2 <<'MESSAGE'
No NVIDIA GPU on this machine, and this build is the GPU variant (docker/compose.gpu.yaml, which
COMPOSE_FILE in .env or a -f names). To run the lab on this machine's CPU, use compose.yaml alone:
delete the COMPOSE_FILE line from .env (and any -f), and run the same docker compose command again.
(A GPU this check cannot see, as under WSL 2: GPU_BUILD_WITHOUT_GPU=1 in .env builds the GPU
images anyway.)
MESSAGE
exit 1
