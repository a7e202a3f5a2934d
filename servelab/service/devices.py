"""Where a model runs: the device a service asks its runtime for, and the one the runtime uses.

A runtime asked for the GPU may run on the CPU instead. ONNX Runtime drops its CUDA execution
provider when the CUDA libraries do not load (a library missing, a driver or CUDA mismatch), runs
every inference on the CPU, and says so only on its own output; PyTorch cannot use CUDA without a
working driver. A service that reported the device it *asked for* would then serve on the CPU
with a GPU's thread plan (one slot), and every measurement would be labelled with the wrong
hardware. So each service reads the device from its runtime once the model is loaded
(`Placement`), plans its threads for that device, and says when it fell back, with the
runtime's own reason.

INFERENCE_DEVICE chooses what to ask for: `auto` (the default: the GPU when the runtime has
one), `cuda` (the GPU; where the runtime cannot use it, the CPU, reported as a fallback), `cpu`.

No runtime is imported at module level: `make artifacts` copies this file next to each service
and Triton model, whichever runtime it runs. Edit it here, never in a copy.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import onnxruntime
    import torch

SETTING = "INFERENCE_DEVICE"
CHOICES = ("auto", "cuda", "cpu")
CUDA_PROVIDER = "CUDAExecutionProvider"
CPU_PROVIDER = "CPUExecutionProvider"

# What ONNX Runtime's C++ log puts before each message ("2026-01-01 10:00:00.0 [E:onnxruntime:
# Default, file.cc:12 Function] "), and the terminal colours it adds even when writing to a file.
_ORT_LOG_PREFIX = re.compile(r"^.*?\[[VIWEF]:onnxruntime:[^\]]*\]\s*")
_COLOURS = re.compile(r"\x1b\[[0-9;]*m")


def device_setting(environ: Mapping[str, str]) -> str:
    """INFERENCE_DEVICE: auto (when unset), cuda or cpu; ValueError saying what to do otherwise."""
    value = environ.get(SETTING, "").strip().lower() or "auto"
    if value not in CHOICES:
        raise ValueError(f"{SETTING}={value!r}: use {', '.join(CHOICES)} (or unset it, for auto).")
    return value


@dataclass(frozen=True)
class Placement:
    """Where a model runs, as its runtime reports it once the model is loaded."""

    device: str  # "cpu", or "cuda" / "cuda (<GPU name>)"
    runtime: str  # the runtime, and for ONNX Runtime the execution provider it runs on
    asked: str  # what the runtime was asked for: "cpu", "cuda" or "cuda:<n>"
    fallback: str | None = None  # asked for a GPU, runs on the CPU: why, in the runtime's words

    def describe(self) -> str:
        text = f"{self.device} ({self.runtime})"
        if self.fallback is not None:
            text += f", INSTEAD OF THE GPU ASKED FOR ({self.asked})"
        return text

    def fallback_warning(self) -> str:
        """What a service says when it fell back (call it only then)."""
        return (
            f"Asked {self.runtime.split()[0]} for the GPU ({self.asked}); it runs on the CPU instead. "
            f"Its reason: {self.fallback}"
        )


# ---- PyTorch ---------------------------------------------------------------------------------


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
    # Once CUDA is initialised, moving the model there either works or raises: it cannot land elsewhere.
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
    """An ONNX Runtime session for `setting` (auto, cuda or cpu), and where it runs: the providers
    the session uses, not those it was asked for. Pass the device it got as the setting of any
    further session of the same model, so that a failed GPU is not tried again."""
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
        runtime=f"onnxruntime {ort.__version__} ({used})",
        asked=asked,
        fallback=said.reason("ONNX Runtime") if fell_back else None,
    )
    return session, placement
