"""Where each service runs, judged from its own report: a FastAPI service's /health (with ONNX Runtime
without a CUDA provider reported CPU, not failed), Triton's log lines, and its load's failures.

Verdicts: PASS and FAIL; CPU for a service whose runtime has no GPU here (ONNX Runtime without a
CUDA provider), reported, neither a pass on the GPU nor a failure; NOT RUN for Triton where it cannot run;
REFERENCE for the original lab's kind of app, measured beside the services and never judged.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from servelab.bench.gpu_check.triton_alone import TRITON_MODEL
from servelab.results import RunResult
from servelab.service.devices import CUDA_PROVIDER

PASS, FAIL, CPU, NOT_RUN, REFERENCE = "PASS", "FAIL", "CPU", "NOT RUN", "REFERENCE"


@dataclass(frozen=True)
class Verdict:
    status: str  # PASS, FAIL, CPU, NOT_RUN or REFERENCE
    reason: str

    def __str__(self) -> str:
        return f"{self.status}: {self.reason}"


def judge_service(health: Mapping[str, Any], asked: str, runtime_without_gpu: str | None = None) -> Verdict:
    """Whether a FastAPI service runs where it was asked to (`asked`: "cuda" or "cpu"), from its
    /health: the device its runtime reports, the fallback's reason, and the first inference it ran
    there at start-up. `runtime_without_gpu` says why its runtime cannot use a GPU here (ONNX
    Runtime without a CUDA provider): it then runs on the CPU, and the verdict is CPU."""
    device = str(health.get("device", "unknown"))
    on_gpu = device.startswith("cuda")
    if asked == "cpu" and on_gpu:
        return Verdict(FAIL, f"asked for the CPU, runs on {device}")
    if asked == "cuda" and runtime_without_gpu is not None and on_gpu:
        return Verdict(FAIL, f"reports {device}, yet {runtime_without_gpu}")
    if asked == "cuda" and runtime_without_gpu is None and not on_gpu:
        return Verdict(FAIL, f"on {device} instead of the GPU: {health.get('device_fallback') or 'no reason given'}")
    if on_gpu and health.get("device_fallback"):
        return Verdict(FAIL, f"reports {device} and a fallback to the CPU: {health['device_fallback']}")
    if "first_inference_ms" not in health:
        return Verdict(
            FAIL,
            f"runs on {device}, its first inference not proven: /health has no first_inference_ms "
            "(the service predates the first-inference check)",
        )
    first_ms = health["first_inference_ms"]
    if first_ms is None:
        return Verdict(FAIL, f"no first inference ran on {device} at start-up (first_inference_ms is null)")
    if asked == "cpu":
        return Verdict(PASS, f"on the CPU as asked, first inference {first_ms:.1f} ms (nothing on a GPU checked)")
    if runtime_without_gpu is not None:
        return Verdict(CPU, f"{runtime_without_gpu}, so it runs on the CPU (first inference {first_ms:.1f} ms)")
    return Verdict(PASS, f"on {device}, first inference {first_ms:.1f} ms there")


def onnx_runtime_without_gpu(providers: Sequence[str], version: str) -> str | None:
    """Why this ONNX Runtime cannot use a GPU (its build has no CUDA provider), or None."""
    if CUDA_PROVIDER in providers:
        return None
    return f"this ONNX Runtime has no CUDA provider (onnxruntime {version}: {', '.join(providers)})"


# How each food_classifier instance says where it runs (models_staging/food_classifier/1/model.py).
_INSTANCE_LINE = re.compile(rf"{TRITON_MODEL} instance (?P<instance>\S+) on (?P<device>\S+)(?P<rest>.*)")


def triton_instances(log_text: str) -> list[re.Match[str]]:
    """Each food_classifier instance's line in Triton's log: its name, its device and the rest."""
    return [match for line in log_text.splitlines() if (match := _INSTANCE_LINE.search(line))]


def judge_triton(log_text: str, asked: str) -> Verdict:
    """Whether Triton's food_classifier instances run where asked, as each says in Triton's log."""
    instances = triton_instances(log_text)
    if not instances:
        return Verdict(FAIL, f"no {TRITON_MODEL} instance said where it runs (Triton's log)")
    devices = sorted({match["device"] for match in instances})
    wrong = [
        match
        for match in instances
        if "INSTEAD OF THE GPU" in match["rest"] or match["device"].startswith("cuda") != (asked == "cuda")
    ]
    if wrong:
        return Verdict(FAIL, f"instance {wrong[0]['instance']} on {wrong[0]['device']}{wrong[0]['rest']}")
    where = "the CPU as asked (nothing on a GPU checked)" if asked == "cpu" else ", ".join(devices)
    return Verdict(PASS, f"{len(instances)} instance(s) on {where}, as Triton's log says")


def judge_load(verdict: Verdict, runs: Sequence[RunResult]) -> Verdict:
    """`verdict`, unless the service answered a request of its load with an error: then FAIL."""
    failed = [run for run in runs if run.error_count]
    if not failed or verdict.status == FAIL:
        return verdict
    kinds = ", ".join(f"{kind} x{count}" for run in failed for kind, count in sorted(run.errors.items()))
    total = sum(run.requests for run in runs)
    return Verdict(FAIL, f"{sum(run.error_count for run in failed)} of {total} requests failed under load ({kinds})")
