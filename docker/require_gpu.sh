#!/bin/sh
# The GPU build's first step (docker/Dockerfile.torch): on a machine without an NVIDIA GPU, stop
# before PyTorch's CUDA build is downloaded, and name the line of .env that runs the CPU variant.
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
No NVIDIA GPU on this machine: compose.yaml alone is the lab for the GPU node. To run the lab on
this machine's CPU, put this line in a file named .env beside compose.yaml (.env.example has it):

    COMPOSE_FILE=compose.yaml:docker/compose.cpu.yaml

and run the same docker compose command again. (A GPU this check cannot see, as under WSL 2:
GPU_BUILD_WITHOUT_GPU=1 in .env builds the GPU images anyway.)
MESSAGE
exit 1
