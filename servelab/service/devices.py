"""Where the in-process ceiling's model runs (servelab.measure.inprocess), decided as the services'
app.py decide it for their own (they import nothing of servelab): the device asked for, and the one
the runtime uses.

A runtime asked for the GPU may run on the CPU instead: ONNX Runtime drops its CUDA provider when the
CUDA libraries do not load, and says so only on its own output; PyTorch cannot use CUDA without a
working driver. A runtime on the GPU may still fail every inference there (cuDNN 9.11 and later has
no code for a Pascal card such as the P100). So the device is read from the runtime once the model
is loaded (`Placement`) and proved by one inference of a blank image (`first_inference`): where the
GPU fails, the CPU, with the runtime's own reason; where the CPU fails too, no model.

INFERENCE_DEVICE (servelab.settings) chooses what to ask for: `auto` (the GPU when the runtime has
one), `cuda` or `cpu`. No runtime is imported at module level: a caller may have only one of them.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import numpy as np

from servelab.service.cores import available_cores

if TYPE_CHECKING:
    import onnxruntime
    import torch

# What torch_model and onnx_session take: INFERENCE_DEVICE's choices (servelab.settings.DEVICES).
CHOICES = ("auto", "cuda", "cpu")
CUDA_PROVIDER = "CUDAExecutionProvider"
CPU_PROVIDER = "CPUExecutionProvider"

# What ONNX Runtime's C++ log puts before each message ("2026-01-01 10:00:00.0 [E:onnxruntime:
# Default, file.cc:12 Function] "), and the terminal colours it adds even when writing to a file.
_ORT_LOG_PREFIX = re.compile(r"^.*?\[[VIWEF]:onnxruntime:[^\]]*\]\s*")
_COLOURS = re.compile(r"\x1b\[[0-9;]*m")


@dataclass(frozen=True)
class Placement:
    """Where a model runs, as its runtime reports it once the model is loaded."""

    device: str  # "cpu", or "cuda" / "cuda (<GPU name>)"
    runtime: str  # the runtime, and for ONNX Runtime the execution provider it runs on
    asked: str  # what the runtime was asked for: "cpu", "cuda" or "cuda:<n>"
    fallback: str | None = None  # asked for a GPU, runs on the CPU: why, in the runtime's words
    first_inference_ms: float | None = None  # the one inference on `device` at start-up; None where none ran

    def describe(self) -> str:
        text = f"{self.device} ({self.runtime})"
        if self.fallback is not None:
            text += f", INSTEAD OF THE GPU ASKED FOR ({self.asked})"
        if self.first_inference_ms is not None:
            text += f", first inference {self.first_inference_ms:.1f} ms"
        return text

    def fallback_warning(self) -> str:
        """What a service says when it fell back (call it only then)."""
        return (
            f"Asked {self.runtime.split()[0]} for the GPU ({self.asked}); it runs on the CPU instead. "
            f"Its reason: {self.fallback}"
        )


# ---- the first inference ---------------------------------------------------------------------

Model = TypeVar("Model")


class FirstInferenceFailed(RuntimeError):
    """The model did not run on the CPU either: a service that would answer every request with an
    error does not start."""


def runtime_error(exc: BaseException) -> str:
    """A runtime's error in one line, its own words (PyTorch's CUDA errors span several lines)."""
    return " / ".join(line.strip() for line in str(exc).splitlines() if line.strip()) or type(exc).__name__


def first_inference(
    placement: Placement, load: Callable[[bool], Model], infer: Callable[[Model], object], runtime_on_cpu: str
) -> tuple[Model, Placement]:
    """The model, proved by one inference on its device, and where it runs, with how long that took.

    `load(on_gpu)` loads the model on the device of `placement` (on_gpu: it is a GPU) or on the
    CPU; `infer(model)` runs one inference of a blank image. Where the GPU's first inference fails
    (its library has no kernels for it, its memory is full...), the model is loaded on the CPU
    instead, with the runtime's error as the reason (`runtime_on_cpu` names the runtime there);
    where the CPU's fails too, FirstInferenceFailed says what failed."""
    if placement.device != "cpu":
        try:
            model = load(True)
            return model, replace(placement, first_inference_ms=_timed_ms(infer, model))
        except Exception as exc:
            failed = f"the first inference on {placement.device} failed: {runtime_error(exc)}"
            placement = replace(placement, device="cpu", runtime=runtime_on_cpu, fallback=failed)
    try:
        model = load(False)
        return model, replace(placement, first_inference_ms=_timed_ms(infer, model))
    except Exception as exc:
        failed = f"The model does not run: its first inference on the CPU ({runtime_on_cpu}) failed: "
        failed += runtime_error(exc)
        if placement.fallback is not None:
            failed += f"; it was on the CPU instead of the GPU ({placement.asked}) because {placement.fallback}"
        raise FirstInferenceFailed(failed) from exc


def _timed_ms(infer: Callable[[Model], object], model: Model) -> float:
    started = time.perf_counter()
    infer(model)  # returns once the answer is back on the CPU, so a GPU's work is timed too
    return (time.perf_counter() - started) * 1000


# ---- PyTorch ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class TorchModel:
    """A PyTorch model and the device it is on: called with a batch, it returns the logits."""

    module: torch.nn.Module
    device: torch.device

    def __call__(self, batch: np.ndarray) -> np.ndarray:
        """Logits [N, classes] of a float32 batch [N, 3, H, W], run with this thread's PyTorch threads."""
        import torch

        with torch.inference_mode():
            return self.module(torch.from_numpy(batch).to(self.device)).float().cpu().numpy()


def torch_model(weights: Path, setting: str) -> tuple[TorchModel, Placement]:
    """The Food-11 MobileNetV2 of `weights` (a state_dict) on the device for `setting` (auto, cuda,
    cpu, or cuda:<n> for a Triton instance), proved by one inference there (`first_inference`),
    and where it runs.

    Built and first run on a short-lived thread of its own: PyTorch's CPU ops start an OpenMP team
    for the thread that calls them, which libgomp frees only when that thread ends. So the caller's
    thread gets no team from it, and an inference thread's team is the one its own inferences
    start. The first inference gets every core (an inference alone, as in every default plan):
    set the caller's threads (torch.set_num_threads) after this call."""
    with ThreadPoolExecutor(1, thread_name_prefix="first-inference") as own_thread:
        return own_thread.submit(_proved_torch_model, weights, setting).result()


def _proved_torch_model(weights: Path, setting: str) -> tuple[TorchModel, Placement]:
    import torch
    from torchvision.models import mobilenet_v2

    from food11 import IMAGE_SIZE, LABELS

    torch.set_num_threads(available_cores())
    # Full FP32 convolutions on every GPU: by default PyTorch lets cuDNN use TF32 on Ampere and newer
    # GPUs (A100, H100), which moves the probabilities by about 2e-4 from the CPU's and ONNX Runtime's
    # answers to the same model (measured on an H100), so the answer would depend on the GPU's
    # generation. A batch-1 MobileNetV2 is bound by kernel launches, not arithmetic: TF32 gains nothing.
    torch.backends.cudnn.allow_tf32 = False
    device, placement = torch_device(setting)

    def load(on_gpu: bool) -> TorchModel:
        on = device if on_gpu else torch.device("cpu")
        module = mobilenet_v2(num_classes=len(LABELS))
        # A state_dict, loaded with weights_only=True: no pickled code is executed.
        module.load_state_dict(torch.load(weights, map_location="cpu", weights_only=True))
        return TorchModel(module.to(on).eval(), on)

    blank = np.zeros((1, 3, IMAGE_SIZE, IMAGE_SIZE), np.float32)
    return first_inference(placement, load, lambda model: model(blank), runtime_on_cpu=placement.runtime)


def torch_device(setting: str) -> tuple[torch.device, Placement]:
    """The device to build a PyTorch model on for `setting` (auto, cuda, cpu, or cuda:<n> for a
    Triton instance), and where that is. A GPU PyTorch cannot use means the CPU, with its reason."""
    import torch

    if setting == "auto":
        setting = "cuda" if torch.cuda.is_available() else "cpu"
    asked = torch.device(setting)
    runtime = f"torch {torch.__version__}"
    if asked.type == "cpu":
        return asked, Placement("cpu", runtime, "cpu")
    try:
        torch.cuda.init()  # raises why CUDA cannot be used: no driver, no GPU visible...
        name = torch.cuda.get_device_name(asked)
    except (AssertionError, RuntimeError) as exc:  # a build without CUDA, or a bad GPU index, asserts
        return torch.device("cpu"), Placement("cpu", runtime, str(asked), fallback=str(exc))
    # Once CUDA is initialised, moving the model there either works or raises: it cannot land
    # elsewhere. Whether the GPU runs it is for the first inference to prove (torch_model).
    return asked, Placement(f"{asked} ({name})", runtime, str(asked))


# ---- ONNX Runtime ----------------------------------------------------------------------------


@dataclass
class RuntimeOutput:
    """What a runtime printed, filled in when `runtime_output()` ends."""

    lines: list[str] = field(default_factory=list)

    def reason(self, runtime: str) -> str:
        return " / ".join(self.lines) or f"{runtime} printed no reason"


@contextmanager
def runtime_output() -> Iterator[RuntimeOutput]:
    """Collects what is printed meanwhile to stdout and stderr, from Python or beneath it (ONNX
    Runtime's C++ log writes to the stderr file descriptor), and the Python warnings raised:
    ONNX Runtime says why it dropped a provider only there. What was printed is passed on
    afterwards to where it was going, so the log keeps it too."""
    said = RuntimeOutput()
    streams = {1: sys.stdout, 2: sys.stderr}
    for stream in streams.values():
        stream.flush()
    captures = {fd: (tempfile.TemporaryFile(), os.dup(fd)) for fd in streams}
    try:
        with (
            warnings.catch_warnings(record=True) as caught,
            # Python's own printing goes through the descriptors too, whatever sys.stdout was.
            open(1, "w", buffering=1, encoding="utf-8", closefd=False) as stdout,
            open(2, "w", buffering=1, encoding="utf-8", closefd=False) as stderr,
            redirect_stdout(stdout),
            redirect_stderr(stderr),
        ):
            warnings.simplefilter("always")
            for fd, (file, _) in captures.items():
                os.dup2(file.fileno(), fd)
            yield said
    finally:
        for fd, (file, original) in captures.items():
            os.dup2(original, fd)
            os.close(original)
            file.seek(0)
            printed = file.read().decode(errors="replace")
            file.close()
            streams[fd].write(printed)
            streams[fd].flush()
            said.lines += [line for line in map(_cleaned, printed.splitlines()) if line]
    said.lines += [str(warning.message) for warning in caught]


def _cleaned(line: str) -> str:
    return _ORT_LOG_PREFIX.sub("", _COLOURS.sub("", line)).strip(" *")


def onnx_session(
    model_path: Path, options: onnxruntime.SessionOptions, setting: str
) -> tuple[onnxruntime.InferenceSession, Placement]:
    """An ONNX Runtime session for `setting` (auto, cuda or cpu), proved by one inference
    (`first_inference`), and where it runs: the providers the session uses, not those it was asked
    for. Pass the device it got as the setting of any further session of the same model, so that a
    failed GPU is not tried again. The first inference runs on the calling thread: a session's
    threads are its own, so it leaves the caller none."""
    import onnxruntime as ort

    in_build = CUDA_PROVIDER in ort.get_available_providers()  # onnxruntime-gpu has it, on any machine
    asked = "cuda" if setting == "cuda" or (setting == "auto" and in_build) else "cpu"
    providers = [CUDA_PROVIDER, CPU_PROVIDER] if asked == "cuda" else [CPU_PROVIDER]
    with runtime_output() as said:
        if asked == "cuda" and in_build:
            # The CUDA and cuDNN libraries of the pip packages (onnxruntime-gpu[cuda,cudnn]), loaded
            # from beside onnxruntime wherever Python installed it: the dynamic loader would not look
            # in site-packages, and a fixed LD_LIBRARY_PATH holds for one Python layout only.
            ort.preload_dlls()
        session = ort.InferenceSession(str(model_path), options, providers=providers)
    # A run that fails on the GPU raises, rather than moving this session to the CPU unannounced.
    session.disable_fallback()
    used = session.get_providers()[0]
    fell_back = asked == "cuda" and used != CUDA_PROVIDER
    placement = Placement(
        device="cuda" if used == CUDA_PROVIDER else "cpu",
        runtime=_onnx_runtime(used),
        asked=asked,
        fallback=said.reason("ONNX Runtime") if fell_back else None,
    )

    def load(on_gpu: bool) -> onnxruntime.InferenceSession:
        if on_gpu or placement.device == "cpu":
            return session  # the one made above, on the device it reports
        return ort.InferenceSession(str(model_path), options, providers=[CPU_PROVIDER])  # the GPU failed

    return first_inference(placement, load, _run_blank, runtime_on_cpu=_onnx_runtime(CPU_PROVIDER))


def _onnx_runtime(provider: str) -> str:
    import onnxruntime as ort

    return f"onnxruntime {ort.__version__} ({provider})"


def _run_blank(session: onnxruntime.InferenceSession) -> None:
    """One inference of a blank batch of one: zeros in the shape of the first input, its
    symbolic dimensions (the batch) 1."""
    first = session.get_inputs()[0]
    shape = [dim if isinstance(dim, int) else 1 for dim in first.shape]
    session.run(None, {first.name: np.zeros(shape, np.float32)})
