"""Where a model runs: read from the runtime once loaded, and a GPU asked for but not had is said.

Runs on any machine: a GPU the runtime cannot use is made so here (a failure put in the runtime's
place, as it reports one), whatever the machine has.
"""

from __future__ import annotations

import os

import onnxruntime as ort
import pytest
import torch

from servelab import paths
from servelab.service import devices
from servelab.service.devices import Placement, device_setting, onnx_session, torch_device

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


@pytest.mark.parametrize(("value", "setting"), [(None, "auto"), ("", "auto"), (" CUDA ", "cuda"), ("cpu", "cpu")])
def test_the_device_setting_is_auto_unless_set(value, setting):
    assert device_setting({} if value is None else {"INFERENCE_DEVICE": value}) == setting


def test_a_device_setting_it_does_not_know_says_what_to_use():
    with pytest.raises(ValueError, match=r"INFERENCE_DEVICE='gpu': use auto, cuda, cpu"):
        device_setting({"INFERENCE_DEVICE": "gpu"})


def test_a_fallback_is_described_as_one():
    placement = Placement("cpu", "torch 2.14.1", "cuda:0", fallback="Found no NVIDIA driver on your system.")
    assert placement.describe() == "cpu (torch 2.14.1), INSTEAD OF THE GPU ASKED FOR (cuda:0)"
    assert placement.fallback_warning() == (
        "Asked torch for the GPU (cuda:0); it runs on the CPU instead. "
        "Its reason: Found no NVIDIA driver on your system."
    )
    assert Placement("cpu", "torch 2.14.1", "cpu").describe() == "cpu (torch 2.14.1)"


def test_onnx_runtime_on_the_cpu_when_asked_for_it_or_when_it_has_no_gpu(built_artifacts):
    for setting in ("cpu", "auto"):
        session, placement = onnx_session(paths.ARTIFACTS_DIR / "food11.onnx", ort.SessionOptions(), setting)
        assert session.get_providers() == ["CPUExecutionProvider"]
        assert placement.device == "cpu" and placement.fallback is None
        assert placement.runtime == f"onnxruntime {ort.__version__} (CPUExecutionProvider)"


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
