"""Where things live, relative to the repository: a clone in any directory works."""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent

# Everything the lab generates at run time (artifacts, staged Triton repository, logs) lives
# under one git-ignored folder, so `rm -rf .lab` is a full reset.
LAB_DIR = Path(os.environ.get("SERVELAB_DIR", REPO_ROOT / ".lab")).resolve()
ARTIFACTS_DIR = LAB_DIR / "artifacts"
# The running lab's own files (logs and restarts, the staged Triton repository, Ray's token):
# where `make up` keeps them, and where a notebook finds the lab it joins. The tests move them to
# a scratch folder with SERVELAB_STACK_DIR, so that their stack never touches a running `make up`.
STACK_DIR = Path(os.environ.get("SERVELAB_STACK_DIR", LAB_DIR)).resolve()
LOG_DIR = STACK_DIR / "logs"
TRITON_DIR = STACK_DIR / "triton"
RAY_DIR = STACK_DIR / "ray"

# What the lab measured, to keep and compare: the benchmark's reports, every notebook's runs.
RESULTS_DIR = Path(os.environ.get("SERVELAB_RESULTS_DIR", REPO_ROOT / "results")).resolve()

FASTAPI_PT_DIR = REPO_ROOT / "fastapi_pt"
FASTAPI_ONNX_DIR = REPO_ROOT / "fastapi_onnx"
RAY_SERVE_DIR = REPO_ROOT / "ray_serve"
GOURMETGRAM_DIR = REPO_ROOT / "gourmetgram"
MODELS_STAGING_DIR = REPO_ROOT / "models_staging"
# The code every service shares, installed by every service (locally and in every image).
SERVICE_PACKAGE_DIR = Path(__file__).resolve().parent / "service"

# The photo every measurement sends unless told otherwise: one of GourmetGram's bundled samples.
SAMPLE_IMAGE = GOURMETGRAM_DIR / "static" / "samples" / "soup.jpg"
