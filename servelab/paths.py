"""Where things live, relative to the repository: a clone in any directory works.

The folders the lab writes to (LAB_DIR and those under it, ARTIFACTS_DIR, STACK_DIR, RESULTS_DIR)
can be moved by settings (servelab.settings: SERVELAB_DIR, SERVELAB_ARTIFACTS_DIR,
SERVELAB_STACK_DIR, SERVELAB_RESULTS_DIR): they are worked out from the settings when first used,
not when this module is imported.
"""

from __future__ import annotations

import functools
from pathlib import Path

from servelab.settings import settings

REPO_ROOT = Path(__file__).resolve().parent.parent

FASTAPI_PT_DIR = REPO_ROOT / "fastapi_pt"
FASTAPI_ONNX_DIR = REPO_ROOT / "fastapi_onnx"
RAY_SERVE_DIR = REPO_ROOT / "ray_serve"
GOURMETGRAM_DIR = REPO_ROOT / "gourmetgram"
MODELS_STAGING_DIR = REPO_ROOT / "models_staging"
# The code every service shares, installed by every service (locally and in every image).
SERVICE_PACKAGE_DIR = Path(__file__).resolve().parent / "service"

# The photo every measurement sends unless told otherwise: one of GourmetGram's bundled samples.
SAMPLE_IMAGE = GOURMETGRAM_DIR / "static" / "samples" / "soup.jpg"


@functools.cache
def _folders() -> dict[str, Path]:
    chosen = settings()
    # Everything the lab generates at run time (artifacts, staged Triton repository, logs) lives
    # under one git-ignored folder, so `rm -rf .lab` is a full reset.
    lab_dir = (chosen.lab_dir or REPO_ROOT / ".lab").resolve()
    # The running lab's own files (logs and restarts, the staged Triton repository, Ray's token):
    # where `make up` keeps them, and where a notebook finds the lab it joins. The tests move them
    # to a scratch folder, so that their stack never touches a running `make up`.
    stack_dir = (chosen.stack_dir or lab_dir).resolve()
    return {
        "LAB_DIR": lab_dir,
        "ARTIFACTS_DIR": (chosen.artifacts_dir or lab_dir / "artifacts").resolve(),
        "STACK_DIR": stack_dir,
        "LOG_DIR": stack_dir / "logs",
        "TRITON_DIR": stack_dir / "triton",
        "RAY_DIR": stack_dir / "ray",
        # What the lab measured, to keep and compare: the benchmark's reports, every notebook's runs.
        "RESULTS_DIR": (chosen.results_dir or REPO_ROOT / "results").resolve(),
    }


def __getattr__(name: str) -> Path:
    """LAB_DIR, ARTIFACTS_DIR, STACK_DIR, LOG_DIR, TRITON_DIR, RAY_DIR and RESULTS_DIR, from the settings."""
    folders = _folders()
    if name not in folders:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return folders[name]
