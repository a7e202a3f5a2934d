"""How long bringing the GPU node up takes (notebook 2), from figures each of which says where it
comes from: the part of notebook 1's lease plan that no notebook run measures (servelab.time_plan
adds the notebooks).

The images are built on the node in stages (servelab.node_build): what notebooks 3 and 4 need
while notebook 2 waits, then Triton's image while the student works through notebooks 3 and 4. A
stage's minutes are what its images download at a stated rate, until the node has measured it:
servelab.node_build writes each stage's real time to notebooks/node_build_times.json, and the
plan takes that instead.

Standard library only: notebook 1 runs on Chameleon's own Jupyter server, where none of the lab's
other packages are installed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from servelab import node_build

LEASE_MINUTES = 180

# The node's rate of downloading and unpacking an image, from the original lab's own words: its Triton
# base, "about 15 GB", takes "about 20 minutes" to come down and build.
PLANNING_DOWNLOAD_MB_PER_S = 15000 / (20 * 60)
MEASURED_BUILD_TIMES = Path(__file__).resolve().parent.parent / node_build.MEASURED_TIMES


@dataclass(frozen=True)
class Download:
    what: str
    megabytes: float
    source: str


PYPI = "PyPI wheel sizes, read 2026-11-26 (Python 3.11; 3.12's set is the same size)"
# PyTorch's cu126 index cannot be reached from the machine that read them: the torch wheel is
# counted at PyTorch 2.7.1's cu126 size.
PYTORCH_CU126 = 3620
# What each stage of the node's build (servelab.node_build.STAGES) downloads.
DOWNLOADS = {
    "fastapi": (
        Download("PyTorch for CUDA 12.6 and the CUDA libraries it pins (the torch image)", PYTORCH_CU126, PYPI),
        Download("ONNX Runtime 1.25's GPU build, cuDNN 9.10 and CUDA 12.9's libraries (fastapi_onnx)", 1979, PYPI),
        Download("ONNX Runtime's GPU build for Jupyter (PyTorch's CUDA libraries serve it)", 271, PYPI),
        Download(
            "the Python base image, FastAPI, JupyterLab, Ray, tritonclient and the rest",
            1000,
            "a budget, not measured",
        ),
    ),
    "triton": (
        Download(
            "NVIDIA's Triton image, nvcr.io/nvidia/tritonserver:24.10-py3",
            15000,
            "the original lab: about 15 GB (24.06-py3 unpacked: 15.5 GB, triton-inference-server/server#7474)",
        ),
        Download("PyTorch for CUDA 12.6 again, for the Triton image's Python", PYTORCH_CU126, PYPI),
    ),
    "ray_serve": (
        Download("ONNX Runtime with cuDNN and CUDA again (pip's build cache may hold fastapi_onnx's)", 1979, PYPI),
    ),
}

# Starting the services once their images are there: the CPU variant's `up`, until every health
# check passed (`make test-docker`, 2026-11-26, 2 cores).
COMPOSE_UP_S = 35
# python-chi's own estimate while it waits for a bare-metal server: "typically 10 minutes ... up to 20".
SERVER_BOOT_MINUTES = 10
# Not measured: installing Docker, the NVIDIA container toolkit and nvtop with apt, a budget.
INSTALLS_BUDGET_MINUTES = 5


@dataclass(frozen=True)
class Step:
    what: str
    minutes: float
    source: str


def measured_times(path: Path = MEASURED_BUILD_TIMES) -> dict[str, dict]:
    """The stages' times measured on the node (empty until one is written there)."""
    return json.loads(path.read_text()) if path.is_file() else {}


def stage_step(stage: str, download_mb_per_s: float, measured: dict[str, dict]) -> Step:
    """One stage: building and starting its images, measured on the node where it has been, else
    its downloads at `download_mb_per_s` and the time to start its services."""
    what = f"{'build' if stage != 'triton' else 'build, in the background,'} {node_build.stage(stage).what}"
    if entry := measured.get(stage):
        return Step(what, entry["seconds"] / 60, f"measured on the node {entry['machine']}, {entry['date']}")
    megabytes = sum(item.megabytes for item in DOWNLOADS[stage])
    return Step(
        what,
        megabytes / download_mb_per_s / 60 + COMPOSE_UP_S / 60,
        f"{megabytes / 1000:.1f} GB at {download_mb_per_s:g} MB/s, and {COMPOSE_UP_S} s to start",
    )


def setup_steps(
    download_mb_per_s: float = PLANNING_DOWNLOAD_MB_PER_S, measured: dict[str, dict] | None = None
) -> list[Step]:
    """Notebook 2, step by step: each step's minutes and where the figure comes from."""
    return [
        Step("start the server on the node", SERVER_BOOT_MINUTES, "python-chi's estimate (up to 20 minutes)"),
        Step("install Docker, the NVIDIA container toolkit, nvtop", INSTALLS_BUDGET_MINUTES, "a budget, not measured"),
        stage_step("fastapi", download_mb_per_s, measured_times() if measured is None else measured),
    ]


def triton_step(download_mb_per_s: float = PLANNING_DOWNLOAD_MB_PER_S, measured: dict[str, dict] | None = None) -> Step:
    """Triton's stage, which runs while the student works through notebooks 3 and 4."""
    return stage_step("triton", download_mb_per_s, measured_times() if measured is None else measured)


def setup_table(download_mb_per_s: float = PLANNING_DOWNLOAD_MB_PER_S) -> str:
    """Notebook 2's steps, Triton's build behind them, and what each stage downloads, as Markdown tables."""
    lines = ["| bringing the node up | minutes | from |", "| --- | ---: | --- |"]
    steps = [*setup_steps(download_mb_per_s), triton_step(download_mb_per_s)]
    lines += [f"| {step.what} | {step.minutes:.1f} | {step.source} |" for step in steps]
    lines += ["", "| stage | what it downloads | MB | from |", "| --- | --- | ---: | --- |"]
    lines += [
        f"| {stage} | {item.what} | {item.megabytes:.0f} | {item.source} |"
        for stage, items in DOWNLOADS.items()
        for item in items
    ]
    return "\n".join(lines)
