"""How long bringing the GPU node up takes (notebook 2), from figures each of which says where it
comes from: the part of notebook 1's lease plan that no notebook run measures (servelab.time_plan
adds the notebooks).

Standard library only: notebook 1 runs on Chameleon's own Jupyter server, where none of the lab's
other packages are installed.
"""

from __future__ import annotations

from dataclasses import dataclass

LEASE_MINUTES = 180

# The node's download rate is not known before the lease: the plan's assumption, which notebook 2's
# own timing of the build replaces.
PLANNING_DOWNLOAD_MB_PER_S = 50.0


@dataclass(frozen=True)
class Download:
    what: str
    megabytes: float
    source: str
    # Already in the CPU variant's build timed below: where PyTorch's CPU wheel index cannot be
    # reached (as on the machine that timed it), that build installs PyPI's PyTorch, with its CUDA
    # 13 libraries, about the size of the CUDA 12.6 set.
    in_timed_build: bool = False


# What the GPU images download: their Python packages, read from PyPI on 2026-11-26 (wheels as
# downloaded, Python 3.11; Python 3.12's set is the same size). PyTorch's cu126 index cannot be
# reached from the machine that read them, so the torch wheel is counted at the size of PyTorch
# 2.7.1's cu126 wheel; and NVIDIA's Triton image, whose registry cannot be reached either.
GPU_DOWNLOADS = (
    Download(
        "PyTorch for CUDA 12.6 with the CUDA libraries it pins (the torch image: fastapi_pt, jupyter, the model files)",
        3620,
        "PyPI wheel sizes, 2026-11-26",
        in_timed_build=True,
    ),
    Download("the same for Python 3.12 (the Triton image)", 3620, "PyPI wheel sizes, 2026-11-26", in_timed_build=True),
    Download(
        "ONNX Runtime 1.25 with cuDNN 9.10 and CUDA 12.9's libraries (fastapi_onnx and ray_serve, each)",
        2 * 1979,
        "PyPI wheel sizes, 2026-11-26",
    ),
    Download(
        "ONNX Runtime's GPU build in the Jupyter image (PyTorch's CUDA libraries serve it)", 271, "PyPI, 2026-11-26"
    ),
    Download(
        "NVIDIA's Triton image, nvcr.io/nvidia/tritonserver:24.12-py3 (unpacked: the download is compressed, smaller)",
        15500,
        "24.06-py3's unpacked size, triton-inference-server/server#7474",
    ),
)

# `make test-docker` on 2026-11-26, a 2-core machine, nothing cached: building every image of the
# CPU variant (the packages' downloads and unpacking included), then starting the project until
# every health check passed.
CPU_VARIANT_BUILD_S = 393
CPU_VARIANT_UP_S = 35

# python-chi's own estimate while it waits for a bare-metal server: "typically 10 minutes ... up to 20".
SERVER_BOOT_MINUTES = 10
# Not measured: installing Docker, the NVIDIA container toolkit and nvtop with apt, a budget.
INSTALLS_BUDGET_MINUTES = 5


@dataclass(frozen=True)
class Step:
    what: str
    minutes: float
    source: str


def setup_steps(download_mb_per_s: float = PLANNING_DOWNLOAD_MB_PER_S) -> list[Step]:
    """Notebook 2, step by step: each step's minutes and where the figure comes from."""
    downloaded = sum(item.megabytes for item in GPU_DOWNLOADS if not item.in_timed_build)
    return [
        Step("start the server on the node", SERVER_BOOT_MINUTES, "python-chi's estimate (up to 20 minutes)"),
        Step("install Docker, the NVIDIA container toolkit, nvtop", INSTALLS_BUDGET_MINUTES, "a budget, not measured"),
        Step(
            "build the images (the model files among them)",
            CPU_VARIANT_BUILD_S / 60,
            "the CPU variant's build, measured (make test-docker, 2 cores, nothing cached)",
        ),
        Step(
            f"download what the timed build did not: {downloaded / 1000:.1f} GB",
            downloaded / download_mb_per_s / 60,
            f"the sizes below, at {download_mb_per_s:g} MB/s (assumed)",
        ),
        Step("start the Compose project", CPU_VARIANT_UP_S / 60, "measured with the CPU variant"),
    ]


def setup_table(download_mb_per_s: float = PLANNING_DOWNLOAD_MB_PER_S) -> str:
    """Notebook 2's steps, and the downloads they count, as Markdown tables."""
    lines = ["| bringing the node up | minutes | from |", "| --- | ---: | --- |"]
    lines += [f"| {step.what} | {step.minutes:.1f} | {step.source} |" for step in setup_steps(download_mb_per_s)]
    lines += ["", "| what the GPU images download | MB | in the timed build | from |", "| --- | ---: | --- | --- |"]
    lines += [
        f"| {item.what} | {item.megabytes:.0f} | {'yes' if item.in_timed_build else 'no'} | {item.source} |"
        for item in GPU_DOWNLOADS
    ]
    return "\n".join(lines)
