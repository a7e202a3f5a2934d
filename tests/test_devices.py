"""Where a model runs: read from the runtime once loaded, proved by one inference there, and a GPU
asked for but not had, or one that cannot run the model, is said.

Runs on any machine: a GPU the runtime cannot use is made so here (a failure put in the runtime's
place, as it reports one), whatever the machine has.
"""

from __future__ import annotations

import asyncio
import base64
import os
import subprocess
import sys
import textwrap

import httpx
import numpy as np
import onnxruntime as ort
import pytest
import torch
from fastapi import FastAPI
from onnxruntime.capi.onnxruntime_pybind11_state import Fail

from food11 import LABELS
from servelab import paths
from servelab.service import devices
from servelab.service.cores import available_cores
from servelab.service.devices import (
    FirstInferenceFailed,
    Placement,
    onnx_session,
    torch_device,
    torch_model,
)
from tests.helpers import discard, make_image_bytes, service_module

# What onnxruntime-gpu 1.25 printed in a python:3.11 image whose CUDA libraries were not found
# (issue 32): its C++ log, written straight to the stderr file descriptor, in colour.
ORT_LOAD_FAILURE = (
    "\x1b[1;31m2026-01-01 10:00:00.000000000 [E:onnxruntime:Default, provider_bridge_ort.cc:2369 "
    "TryGetProviderInfo_CUDA] Failed to load library libonnxruntime_providers_cuda.so with error: "
    "libcublasLt.so.12: cannot open shared object file: No such file or directory\n\x1b[m\n"
    "\x1b[0;93m2026-01-01 10:00:00.000000001 [W:onnxruntime:Default, onnxruntime_pybind_state.cc:1099 "
    "CreateExecutionProviderFactoryInstance] Failed to create CUDAExecutionProvider. Require cuDNN 9.* and "
    "CUDA 12.*.\x1b[m\n"
)
# What ONNX Runtime raises when a CUDA kernel cannot run on the GPU (a library without code for its
# architecture: cuDNN 9.11 and later on a P100): the session loaded with CUDA, and its run fails.
ORT_RUN_FAILURE = (
    "[ONNXRuntimeError] : 1 : FAIL : Non-zero status code returned while running Conv node. Name:'Conv_0' "
    "Status Message: CUDA error cudaErrorNoKernelImageForDevice:no kernel image is available for execution on "
    "the device"
)
GPU_NAME = "Tesla P100-PCIE-16GB"


def test_a_fallback_and_the_first_inference_are_described():
    placement = Placement("cpu", "torch 2.14.1", "cuda:0", "Found no NVIDIA driver on your system.", 31.04)
    assert placement.describe() == "cpu (torch 2.14.1), INSTEAD OF THE GPU ASKED FOR (cuda:0), first inference 31.0 ms"
    assert placement.fallback_warning() == (
        "Asked torch for the GPU (cuda:0); it runs on the CPU instead. "
        "Its reason: Found no NVIDIA driver on your system."
    )
    on_gpu = Placement("cuda:0 (NVIDIA H200)", "torch 2.14.1", "cuda:0", first_inference_ms=35.24)
    assert on_gpu.describe() == "cuda:0 (NVIDIA H200) (torch 2.14.1), first inference 35.2 ms"
    assert Placement("cpu", "torch 2.14.1", "cpu").describe() == "cpu (torch 2.14.1)"


def test_onnx_runtime_on_the_cpu_when_asked_for_it_or_when_it_has_no_gpu(built_artifacts):
    for setting in ("cpu", "auto"):
        session, placement = onnx_session(paths.ARTIFACTS_DIR / "food11.onnx", ort.SessionOptions(), setting)
        assert session.get_providers() == ["CPUExecutionProvider"]
        assert placement.device == "cpu" and placement.fallback is None
        assert placement.runtime == f"onnxruntime {ort.__version__} (CPUExecutionProvider)"
        assert placement.first_inference_ms > 0  # the CPU's first inference is run too


def test_onnx_runtime_asked_for_a_gpu_build_it_lacks_falls_back_with_its_warning(built_artifacts, monkeypatch):
    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CPUExecutionProvider"])  # the CPU build
    _, placement = onnx_session(paths.ARTIFACTS_DIR / "food11.onnx", ort.SessionOptions(), "cuda")
    assert (placement.device, placement.asked) == ("cpu", "cuda")
    assert "CUDAExecutionProvider" in placement.fallback  # ONNX Runtime's own warning: not in this build


def test_onnx_runtime_whose_cuda_libraries_do_not_load_is_reported_on_the_cpu_in_its_own_words(
    built_artifacts, monkeypatch, capfd
):
    """The case of issue 32: the GPU build, its CUDA provider dropped at session creation, said only
    on the stderr file descriptor. The reason is read from there, and the log still gets it."""
    real_session = ort.InferenceSession
    preloaded = []

    def failing_cuda(path, options, providers):
        assert providers == ["CUDAExecutionProvider", "CPUExecutionProvider"]
        os.write(2, ORT_LOAD_FAILURE.encode())  # beneath Python, as ONNX Runtime's C++ log writes
        return real_session(path, options, providers=["CPUExecutionProvider"])

    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])
    monkeypatch.setattr(ort, "preload_dlls", lambda: preloaded.append(True))
    monkeypatch.setattr(ort, "InferenceSession", failing_cuda)
    session, placement = onnx_session(paths.ARTIFACTS_DIR / "food11.onnx", ort.SessionOptions(), "auto")

    assert preloaded, "the pip CUDA libraries are loaded before the session asks for CUDA"
    assert session.get_providers() == ["CPUExecutionProvider"]
    assert (placement.device, placement.asked) == ("cpu", "cuda")
    assert placement.runtime.endswith("(CPUExecutionProvider)")
    assert placement.fallback == (
        "Failed to load library libonnxruntime_providers_cuda.so with error: libcublasLt.so.12: cannot open "
        "shared object file: No such file or directory / Failed to create CUDAExecutionProvider. Require cuDNN 9.* "
        "and CUDA 12.*."
    )
    assert ORT_LOAD_FAILURE in capfd.readouterr().err  # passed on to the log as it was
    assert placement.first_inference_ms > 0


def test_what_the_runtime_prints_meanwhile_is_kept_in_order_and_passed_on(capfd):
    with devices.runtime_output() as said:
        print("on stdout")
        os.write(2, b"on the stderr descriptor\n")
    assert said.lines == ["on stdout", "on the stderr descriptor"]
    seen = capfd.readouterr()
    assert (seen.out, seen.err) == ("on stdout\n", "on the stderr descriptor\n")


def test_pytorch_on_the_gpu_it_cannot_use_falls_back_to_the_cpu_with_its_reason(monkeypatch):
    reason = "Found no NVIDIA driver on your system."

    def no_driver() -> None:
        raise RuntimeError(reason)

    monkeypatch.setattr(torch.cuda, "init", no_driver)
    for asked in ("cuda", "cuda:1"):  # INFERENCE_DEVICE=cuda in a service, a Triton instance's GPU
        device, placement = torch_device(asked)
        assert device == torch.device("cpu")
        assert placement == Placement(
            "cpu", f"torch {torch.__version__}", asked, "Found no NVIDIA driver on your system."
        )


def test_pytorch_asked_for_auto_or_the_cpu_runs_on_the_cpu_unless_a_gpu_is_usable(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for setting in ("auto", "cpu"):
        device, placement = torch_device(setting)
        assert device == torch.device("cpu") and placement == Placement("cpu", f"torch {torch.__version__}", "cpu")


# ---- the first inference: a GPU that loads the model and cannot run it ------------------------

REAL_SESSION = ort.InferenceSession


class SessionOnAGpuThatCannotRun:
    """An ONNX Runtime session as onnxruntime-gpu makes it on a GPU its libraries have no kernels
    for: it reports CUDA first, and its run fails with ONNX Runtime's own error. A real session on
    the CPU underneath; a session asked for the CPU only runs there (unless `cpu_fails` too)."""

    cpu_fails = False
    made: list[list[str]] = []  # the providers each session was asked for (a list of its own in each test)

    def __init__(self, path, options, providers):
        self.made.append(providers)
        self.providers = providers
        self.cpu = REAL_SESSION(path, options, providers=["CPUExecutionProvider"])

    def get_providers(self):
        return self.providers

    def run(self, *args, **kwargs):
        if self.providers[0] == "CUDAExecutionProvider" or self.cpu_fails:
            raise Fail(ORT_RUN_FAILURE)
        return self.cpu.run(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.cpu, name)


@pytest.fixture
def onnx_runtime_on_a_gpu_that_cannot_run(monkeypatch):
    """The GPU build of ONNX Runtime, whose CUDA session loads and whose first run fails."""
    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])
    monkeypatch.setattr(ort, "preload_dlls", lambda: None)
    monkeypatch.setattr(ort, "InferenceSession", SessionOnAGpuThatCannotRun)
    monkeypatch.setattr(SessionOnAGpuThatCannotRun, "made", [])
    return SessionOnAGpuThatCannotRun


async def health_and_a_prediction(app: FastAPI) -> tuple[dict, httpx.Response]:
    """A service's /health, and its answer to POST /predict with a photo, asked in this process
    while it runs (from its start-up to its shutdown)."""
    image = base64.b64encode(make_image_bytes(1)).decode()
    transport = httpx.ASGITransport(app=app)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://service") as client,
    ):
        health = (await client.get("/health")).json()
        return health, await client.post("/predict", json={"image": image})


def test_onnx_runtime_whose_first_run_fails_on_the_gpu_runs_on_the_cpu_with_its_error(
    built_artifacts, onnx_runtime_on_a_gpu_that_cannot_run
):
    session, placement = onnx_session(paths.ARTIFACTS_DIR / "food11.onnx", ort.SessionOptions(), "auto")
    assert session.get_providers() == ["CPUExecutionProvider"]
    assert (placement.device, placement.asked) == ("cpu", "cuda")
    assert placement.runtime == f"onnxruntime {ort.__version__} (CPUExecutionProvider)"
    assert placement.fallback == f"the first inference on cuda failed: {ORT_RUN_FAILURE}"
    assert placement.first_inference_ms > 0  # the CPU's, on the session served
    logits = session.run(["output"], {"input": np.zeros((1, 3, 224, 224), np.float32)})[0]
    assert logits.shape == (1, len(LABELS))


def served_on_the_cpu(flavor: str, error: str, **environment: str) -> dict:
    """fastapi_<flavor>'s own app.py, with its own model and `environment`, asked for a GPU whose first
    inference fails with `error`: it serves on the CPU, with the CPU's plan, and says why; its /health."""
    model_file = {"pt": "food11.pth", "onnx": "food11.onnx"}[flavor]
    environment = {"FOOD11_MODEL_PATH": str(paths.ARTIFACTS_DIR / model_file), **environment}
    service = service_module(flavor, environment, real_model=True)
    try:
        health, answer = asyncio.run(health_and_a_prediction(service.app))
    finally:
        discard(service)
    assert (health["device"], health["device_asked"]) == ("cpu", "cuda")
    assert health["device_fallback"] == f"the model did not run on cuda: {error}"
    assert health["first_inference_ms"] > 0
    assert health["slots"] == available_cores()  # the CPU's plan: a slot per core
    assert answer.status_code == 200 and answer.json()["prediction"] in LABELS
    return health


def test_the_onnx_service_on_a_gpu_that_cannot_run_serves_on_the_cpu_and_says_why(
    built_artifacts, onnx_runtime_on_a_gpu_that_cannot_run
):
    """fastapi_onnx's app (every Ray Serve replica's too), asked for the GPU by default."""
    health = served_on_the_cpu("onnx", ORT_RUN_FAILURE)
    assert health["runtime"] == f"onnxruntime {ort.__version__} (CPUExecutionProvider)"
    made = onnx_runtime_on_a_gpu_that_cannot_run.made
    assert made == [["CUDAExecutionProvider"], ["CPUExecutionProvider"]], "the failed GPU is not tried again"


def test_onnx_runtime_that_cannot_run_on_the_cpu_either_stops_the_start_saying_what_failed(
    built_artifacts, onnx_runtime_on_a_gpu_that_cannot_run, monkeypatch
):
    monkeypatch.setattr(onnx_runtime_on_a_gpu_that_cannot_run, "cpu_fails", True)
    with pytest.raises(FirstInferenceFailed) as failed:
        onnx_session(paths.ARTIFACTS_DIR / "food11.onnx", ort.SessionOptions(), "cuda")
    assert str(failed.value) == (
        f"The model does not run: its first inference on the CPU (onnxruntime {ort.__version__} "
        f"(CPUExecutionProvider)) failed: {ORT_RUN_FAILURE}; it was on the CPU instead of the GPU (cuda) because "
        f"the first inference on cuda failed: {ORT_RUN_FAILURE}"
    )
    assert isinstance(failed.value.__cause__, Fail)  # the runtime's own exception, for the traceback


@pytest.fixture
def pytorch_naming_a_gpu_it_cannot_use(monkeypatch):
    """PyTorch that says a GPU is there (its name) where none can run: moving the model there fails
    inside PyTorch, as on this machine (a CUDA build, no driver) or a CPU-only build. Returns the
    error PyTorch raises for it here, in one line."""
    try:
        torch.zeros(1, device="cuda")
    except (AssertionError, RuntimeError) as exc:
        error = devices.runtime_error(exc)
    else:
        pytest.skip("this machine has a GPU PyTorch can use")
    monkeypatch.setattr(torch.cuda, "init", lambda: None)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: GPU_NAME)
    return error


def test_pytorch_whose_gpu_cannot_run_the_model_runs_on_the_cpu_with_its_error(
    built_artifacts, pytorch_naming_a_gpu_it_cannot_use
):
    weights = paths.ARTIFACTS_DIR / "food11.pth"
    model, placement = torch_model(weights, "cuda")
    assert placement.device == "cpu" and placement.asked == "cuda"
    assert placement.runtime == f"torch {torch.__version__}"
    pytorch_error = pytorch_naming_a_gpu_it_cannot_use
    assert placement.fallback == f"the first inference on cuda ({GPU_NAME}) failed: {pytorch_error}"
    assert placement.first_inference_ms > 0
    assert model.device == torch.device("cpu")
    batch = np.random.default_rng(0).standard_normal((2, 3, 224, 224), dtype=np.float32)
    on_the_cpu, _ = torch_model(weights, "cpu")
    np.testing.assert_array_equal(model(batch), on_the_cpu(batch))  # the same model, running


def test_pytorch_that_cannot_run_on_the_cpu_either_stops_the_start_saying_what_failed(
    built_artifacts, pytorch_naming_a_gpu_it_cannot_use, monkeypatch
):
    def failing_convolution(*args, **kwargs):
        raise RuntimeError("could not create a primitive descriptor for a convolution forward propagation primitive")

    monkeypatch.setattr(torch.nn.functional, "conv2d", failing_convolution)
    with pytest.raises(FirstInferenceFailed) as failed:
        torch_model(paths.ARTIFACTS_DIR / "food11.pth", "cuda")
    assert str(failed.value) == (
        f"The model does not run: its first inference on the CPU (torch {torch.__version__}) failed: could not "
        "create a primitive descriptor for a convolution forward propagation primitive; it was on the CPU instead "
        f"of the GPU (cuda) because the first inference on cuda ({GPU_NAME}) failed: "
        f"{pytorch_naming_a_gpu_it_cannot_use}"
    )
    with pytest.raises(FirstInferenceFailed, match=r"^The model does not run: .* could not create a primitive"):
        torch_model(paths.ARTIFACTS_DIR / "food11.pth", "cpu")


def test_the_pytorch_service_on_a_gpu_that_cannot_run_serves_on_the_cpu_and_says_why(
    built_artifacts, pytorch_naming_a_gpu_it_cannot_use
):
    health = served_on_the_cpu("pt", pytorch_naming_a_gpu_it_cannot_use, INFERENCE_DEVICE="cuda")
    assert health["runtime"] == f"torch {torch.__version__}"


@pytest.mark.skipif(available_cores() < 2, reason="a team of one thread starts no thread to count")
def test_the_pytorch_first_inference_leaves_the_calling_thread_no_team_of_threads(built_artifacts):
    """PyTorch's CPU ops start an OpenMP team for the thread that calls them. The first inference
    runs on a thread of its own, whose team ends with it: an inference on the calling thread
    afterwards starts this thread's team (cores - 1 new threads), so none was left on it. Counted
    in a fresh process, whose main thread has run nothing."""
    script = textwrap.dedent(
        """
        import os, time
        import torch
        from servelab import paths
        from servelab.service.cores import available_cores
        from servelab.service.devices import torch_model

        def threads():
            return len(os.listdir("/proc/self/task"))

        model, _ = torch_model(paths.ARTIFACTS_DIR / "food11.pth", "cpu")
        settled, deadline = threads(), time.monotonic() + 10
        while time.monotonic() < deadline:  # the first inference's team leaves once its thread has
            time.sleep(0.5)
            if threads() == settled:
                break
            settled = threads()
        torch.set_num_threads(available_cores())
        model(torch.zeros(1, 3, 224, 224).numpy())
        print(threads() - settled)
        """
    )
    ran = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=paths.REPO_ROOT)
    assert ran.returncode == 0, ran.stderr
    assert int(ran.stdout.split()[-1]) == available_cores() - 1
