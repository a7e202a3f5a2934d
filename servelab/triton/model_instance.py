"""The set-up every Python-backend model of the lab does as Triton starts one of its instances.

Triton runs each instance of a Python-backend model as a process of its own and calls its
`initialize(args)` there. Every model of the lab (models_staging/*/1/model.py, and
servelab/triton/onnx_model.py where the server has no ONNX Runtime backend) then does the same,
which `set_up_instance` does for it:
- it loads its model on the device Triton gave the instance (its GPU, or the CPU), proved by one
  inference there, and logs a fall back to the CPU with the runtime's reason
  (servelab.service.devices);
- it plans its threads for the device the model runs on and for every instance in the config: on
  a CPU the instances share the cores out elastically, counting the instances at work through
  lock files (servelab.service.cores).
The model keeps what is its own (its sessions, its state), and logs where it runs with its plan
(`ModelInstance.log_started`). A model that answers a request its client cancelled (a gRPC cancel)
with CANCELLED instead of computing it asks `ModelInstance.cancelled`, which logs how many as the
lab's log readers count them (servelab.triton.stats.cancelled_by_model), and answers each with
`cancelled_response`. A model whose compute holds stages of its own (decoding, then the forward
pass) times each with a `StageClock`, which Triton reports at its /metrics.

The models import this module from the servelab installed in the server's Python: the Triton
image installs the whole package (docker/Dockerfile.triton); locally, each staged model.py starts
by putting the lab's virtualenv, where servelab is installed editable, on sys.path
(servelab.triton.server.site_packages_prelude). Nothing of Triton's is imported here
(triton_python_backend_utils exists only inside the backend): the model passes its logger in, and
that module itself where an answer is built from it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

from servelab.service.cores import RunningAcrossProcesses, ThreadPlan, thread_plan, threads_at_work
from servelab.service.devices import Placement

# What a request cancelled before its inference is answered, with Triton's CANCELLED code.
CANCELLED_BEFORE_INFERENCE = "cancelled by the client before inference"


class TritonLogger(Protocol):
    """The Python backend's logger (`triton_python_backend_utils.Logger`), as far as it is used here."""

    def log_info(self, message: str) -> None: ...

    def log_warn(self, message: str) -> None: ...


def instance_count(config: Mapping[str, Any]) -> int:
    """Instances of the model in the server, each a process of its own (a KIND_GPU group's count
    is per GPU it lists)."""
    return sum(group["count"] * max(1, len(group.get("gpus") or [])) for group in config["instance_group"])


@dataclass
class ModelInstance:
    """One instance of a Python-backend model, set up: its model, where that runs, its threads."""

    model_name: str
    name: str  # the instance's, as Triton names it: food_classifier_0_0
    model: Any  # what `load` gave (a TorchModel, an ONNX Runtime session); None where there was no `load`
    placement: Placement | None  # where `model` runs, as its runtime reports it
    plan: ThreadPlan
    running: RunningAcrossProcesses | None  # the model's instances at work, where the plan is elastic
    logger: TritonLogger

    def threads_at_work(self) -> AbstractContextManager[int]:
        """The threads this instance may use while the block runs, the block counted as work."""
        return threads_at_work(self.plan, self.running)

    def log_started(self, where: str) -> None:
        """Log the instance as started: `where` it runs ("on cpu (torch 2.9.1), ..."), with anything
        the model adds, then its thread plan; a warning when the plan has more threads than cores."""
        log = self.logger.log_warn if self.plan.oversubscribed else self.logger.log_info
        log(f"{self.model_name} instance {self.name} {where}; threads: {self.plan.describe()}")

    def cancelled(self, requests: Sequence[Any]) -> list[bool]:
        """Which of `requests` their client has cancelled, asked once each (`is_cancelled()` is a round
        trip to the server, so not in a loop); how many is logged, the line that
        servelab.triton.stats.cancelled_by_model counts."""
        gone = [bool(request.is_cancelled()) for request in requests]
        if any(gone):
            answered = "answered CANCELLED, not computed"
            self.logger.log_info(f"{self.model_name}: {sum(gone)} cancelled request(s) {answered}")
        return gone

    def close(self) -> None:
        """Leave the instances at work (the model's `finalize`)."""
        if self.running is not None:
            self.running.close()


# Triton's custom metric (its /metrics) of the time a model spent in each stage of its own, in
# microseconds since the instance started: what Triton's "compute infer" holds, told apart (a
# Python-backend model decodes every image before the forward pass, one after another).
STAGE_METRIC = "lab_model_stage_us"


class StageClock:
    """A Python-backend model's own time in each of its stages ("decode", "forward"), counted in
    Triton's custom metric STAGE_METRIC, labelled by model, stage and process. The process label keeps
    each instance's series its own: Triton removes a series when the last object holding it in one
    process is deleted, and an instance reloaded starts its new process before the old one ends.
    `backend` is triton_python_backend_utils, which only the model can import."""

    def __init__(self, backend: Any, model_name: str, stages: Sequence[str]) -> None:
        self.family = backend.MetricFamily(
            name=STAGE_METRIC,
            description="time a lab model spent in each of its stages, microseconds",
            kind=backend.MetricFamily.COUNTER,
        )
        process = str(os.getpid())
        self.metrics = {
            stage: self.family.Metric(labels={"model": model_name, "stage": stage, "process": process})
            for stage in stages
        }

    @contextmanager
    def timed(self, stage: str) -> Iterator[None]:
        """Count the block's time to `stage`."""
        started = time.perf_counter_ns()
        try:
            yield
        finally:
            self.metrics[stage].increment((time.perf_counter_ns() - started) / 1000)

    def close(self) -> None:
        """The metrics before their family, as the Python backend asks (the model's `finalize`)."""
        self.metrics.clear()
        del self.family


def cancelled_response(backend: Any) -> Any:
    """The answer to a request whose client cancelled it before its inference: Triton's CANCELLED
    error. `backend` is triton_python_backend_utils, which only the model can import."""
    return backend.InferenceResponse(
        error=backend.TritonError(CANCELLED_BEFORE_INFERENCE, backend.TritonError.CANCELLED)
    )


def set_up_instance(
    args: Mapping[str, str],
    config: Mapping[str, Any],
    logger: TritonLogger,
    load: Callable[[str], tuple[Any, Placement]] | None = None,
    *,
    gpu_by_index: bool = True,
) -> ModelInstance:
    """The instance that Triton's `args` start, of the model `config` describes (args["model_config"],
    parsed): its model, loaded by `load(device)` on the device Triton gave it, and its threads,
    planned for where the model runs (the CPU where there is no `load`).

    `load` is asked for "cuda:<n>", Triton's GPU for this instance, or "cpu" (servelab.service.devices
    proves the model by one inference there); with `gpu_by_index` False, for "cuda", as ONNX Runtime's
    sessions are (`onnx_session`).
    """
    name = args["model_instance_name"]
    model, placement = None, None
    if load is not None:
        gpu = f"cuda:{args['model_instance_device_id']}" if gpu_by_index else "cuda"
        model, placement = load(gpu if args["model_instance_kind"] == "GPU" else "cpu")
        if placement.fallback is not None:
            logger.log_warn(f"{config['name']} instance {name}: {placement.fallback_warning()}")
    instances = instance_count(config)
    plan = thread_plan(
        slots=instances,
        device=placement.device if placement is not None else "cpu",
        given_by=f"{instances} instance(s) in the config",
    )
    running = None
    if plan.elastic:
        running = RunningAcrossProcesses.of_triton_model(config["name"], args["model_repository"], name)
    return ModelInstance(config["name"], name, model, placement, plan, running, logger)
