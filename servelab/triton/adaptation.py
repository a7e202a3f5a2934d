"""A config adapted to the Triton server that runs it: the backends it has, and its GPUs.

The shipped configs are written for the GPU node's Triton image: KIND_GPU instances, and the ONNX
model on Triton's ONNX Runtime backend. A server stages a config changed only as far as it must
be (`adapt_to_server`): CPU instances where it has no GPU, instances moved off GPUs it lacks, the
ONNX model served by the Python backend where it has no ONNX Runtime backend, and the weights
record added as parameters. Each change is a `TritonConfig` edit (servelab.triton.config), so
the staged file keeps the shipped text and a diff shows just the change.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

from tritonclient.grpc import model_config_pb2

from servelab.service.hardware import Hardware
from servelab.triton.config import ConfigError, ModelConfigProto, TritonConfig

# Every Triton build has the Python backend; the pip-installed one (the local stack, and the
# Compose project's stand-in for the Triton image where that image cannot be pulled) has no other.
PYTHON_BACKEND = "python"
# A model for Triton's ONNX Runtime backend is served, by a server without that backend, by a
# Python-backend model that runs the same model.onnx with ONNX Runtime (servelab/triton/onnx_model.py).
ONNX_BACKEND = "onnxruntime"
ONNX_PLATFORM = "onnxruntime_onnx"
SERVED_BY_ONNX = (
    "Python backend running model.onnx with ONNX Runtime (CPU). Adapted: the shipped config asks for "
    'backend "onnxruntime", which this Triton server does not include.'
)


def backend_of(config: ModelConfigProto) -> str:
    """The backend a config asks for, also when it names a platform instead (`onnxruntime_onnx`)."""
    if config.backend:
        return config.backend
    return ONNX_BACKEND if config.platform == ONNX_PLATFORM else config.platform


def gpus_missing(config: TritonConfig, server: Hardware) -> list[int]:
    """The GPUs that `config`'s KIND_GPU instance groups name and `server` lacks, which Triton refuses
    ("invalid or unsupported gpu id"); none on a server without GPUs, which runs every instance on
    its CPU."""
    named = {
        gpu
        for group in config.proto.instance_group
        if group.kind == model_config_pb2.ModelInstanceGroup.KIND_GPU
        for gpu in group.gpus
    }
    return sorted(gpu for gpu in named if gpu >= server.gpus) if server.gpus else []


def _on_gpus_it_has(group: Any, gpus: int) -> list[Any]:
    """Copies of one instance group for a server with `gpus` GPUs: as written where it names only
    GPUs the server has; else with the instances on GPUs it lacks moved to the GPUs it has (GPU g
    to GPU g mod `gpus`), as many as written, in one group where every GPU it lands on takes the
    same number, else in one group per GPU. A GPU is never listed twice in a group: its instances
    would get the same names."""
    written = model_config_pb2.ModelInstanceGroup()
    written.CopyFrom(group)
    if group.kind != model_config_pb2.ModelInstanceGroup.KIND_GPU or all(gpu < gpus for gpu in group.gpus):
        return [written]
    lands_on = Counter(gpu % gpus for gpu in group.gpus)  # GPU -> how many of the group's GPUs land on it
    splits = [sorted(lands_on)] if len(set(lands_on.values())) == 1 else [[gpu] for gpu in sorted(lands_on)]
    parts = []
    for targets in splits:
        part = model_config_pb2.ModelInstanceGroup()
        part.CopyFrom(written)
        part.count = (group.count or 1) * lands_on[targets[0]]  # Triton runs 1 where count is unset
        part.gpus[:] = targets
        if group.name and len(splits) > 1:  # a split group's parts need names of their own
            part.name = f"{group.name}_gpu{targets[0]}"
        parts.append(part)
    return parts


def adapt_to_server(config: TritonConfig, server: Hardware, weights: Mapping[str, str] | None = None) -> TritonConfig:
    """The config a Triton server with `server`'s GPUs and backends serves: CPU instances where it
    has no GPU, instances on GPUs it lacks moved to the GPUs it has, the Python backend running the
    ONNX graph where it has no ONNX Runtime backend, and the weights record as parameters. On the
    GPU node's image (two GPUs), a config naming GPUs 0 and 1 only gets the weights record.

    Raises ConfigError, saying what to do, for a backend the server cannot run.
    """
    backend = backend_of(config.proto)
    onnx_by_python = backend == ONNX_BACKEND and backend not in server.backends
    if backend not in server.backends and not onnx_by_python:
        raise ConfigError(
            f"{config.origin}: backend {backend!r} is not in this Triton server, which has "
            f"{', '.join(server.backends)} (an ONNX model is run by the Python backend with ONNX Runtime where the "
            f"onnxruntime backend is missing). Serve this model on the GPU node's Triton image, or write it as a "
            f"Python-backend model (1/model.py)."
        )

    def change(edited: ModelConfigProto) -> None:
        if not server.gpus:
            for group in edited.instance_group:
                if group.kind == model_config_pb2.ModelInstanceGroup.KIND_GPU:
                    group.kind = model_config_pb2.ModelInstanceGroup.KIND_CPU
                del group.gpus[:]
        elif gpus_missing(config, server):
            groups = [part for group in edited.instance_group for part in _on_gpus_it_has(group, server.gpus)]
            del edited.instance_group[:]
            edited.instance_group.extend(groups)
        if onnx_by_python:
            edited.backend, edited.platform = PYTHON_BACKEND, ""
            edited.parameters["served_by"].string_value = SERVED_BY_ONNX
        for key, value in (weights or {}).items():
            edited.parameters[key].string_value = value

    return config.edit(change)
