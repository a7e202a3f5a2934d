"""What each Python-backend model does as Triton starts one of its instances, and in `execute`,
where the real backend cannot show it: the device from Triton's `args` and the CPU with a reason
where the GPU fails, the threads planned for the cores and the config's instances, cancelled
requests answered CANCELLED and logged as the lab's log reader counts them. The models
(models_staging/*/1/model.py, servelab/triton/onnx_model.py) run with their real runtimes, on
Triton's `pb_utils` stood in for; the real Triton serves them in tests/test_triton_server.py."""

from __future__ import annotations

import base64
import importlib.util
import io
import json
import os
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch
from google.protobuf import json_format

from servelab import paths
from servelab.bench.gpu_check.verdicts import FAIL, PASS, judge_triton, triton_instances
from servelab.triton import stats as triton_stats
from servelab.triton.config import TritonConfig
from servelab.triton.server import ONNX_RUNNER_SOURCE
from tests.helpers import make_image_bytes

MODELS = paths.MODELS_STAGING_DIR


class Backend(types.ModuleType):
    """triton_python_backend_utils as far as the models use it, keeping what they log and count."""

    def __init__(self) -> None:
        super().__init__("triton_python_backend_utils")
        self.lines: list[tuple[str, str]] = []
        self.metrics: list[Metric] = []
        backend = self

        class Logger:
            @staticmethod
            def log_info(message: str) -> None:
                backend.lines.append(("info", message))

            @staticmethod
            def log_warn(message: str) -> None:
                backend.lines.append(("warn", message))

        class MetricFamily:
            COUNTER, GAUGE = "COUNTER", "GAUGE"

            def __init__(self, name: str, description: str, kind: str) -> None:
                self.name = name

            def Metric(self, labels: dict[str, str]) -> Metric:  # noqa: N802 (the backend's name)
                metric = Metric(self.name, labels)
                backend.metrics.append(metric)
                return metric

        self.Logger, self.MetricFamily = Logger, MetricFamily
        self.TritonError, self.TritonModelException = TritonError, TritonModelException
        self.InferenceResponse, self.Tensor = InferenceResponse, Tensor

    @staticmethod
    def get_input_tensor_by_name(request: Request, name: str) -> Tensor:
        return request.inputs[name]

    @staticmethod
    def using_decoupled_model_transaction_policy(config: dict) -> bool:
        return config.get("model_transaction_policy", {}).get("decoupled", False)


class TritonError:
    CANCELLED, INVALID_ARG, NOT_FOUND, INTERNAL = "CANCELLED", "INVALID_ARG", "NOT_FOUND", "INTERNAL"

    def __init__(self, message: str, code: str = "INTERNAL") -> None:
        self.message, self.code = message, code


class TritonModelException(Exception):
    pass


class Tensor:
    def __init__(self, name: str, array: np.ndarray) -> None:
        self.name, self.array = name, array

    def as_numpy(self) -> np.ndarray:
        return self.array


class InferenceResponse:
    def __init__(self, output_tensors: list[Tensor] | None = None, error: TritonError | None = None) -> None:
        self.outputs = {tensor.name: tensor.array for tensor in output_tensors or []}
        self.error = error


class Metric:
    def __init__(self, family: str, labels: dict[str, str]) -> None:
        self.family, self.labels, self.value = family, labels, 0.0

    def increment(self, value: float) -> None:
        self.value += value


class Request:
    """A request as `execute` gets it: its inputs, and whether its client cancelled it (asked how often)."""

    def __init__(self, cancelled: bool = False, **inputs: np.ndarray) -> None:
        self.inputs = {name: Tensor(name, array) for name, array in inputs.items()}
        self.cancelled, self.asked = cancelled, 0

    def is_cancelled(self) -> bool:
        self.asked += 1
        return self.cancelled


def photo_request(*photos: bytes, cancelled: bool = False) -> Request:
    encoded = np.array([[base64.b64encode(photo)] for photo in photos], dtype=object)
    return Request(cancelled, INPUT_IMAGE=encoded)


@pytest.fixture
def backend(monkeypatch) -> Backend:
    stand_in = Backend()
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", stand_in)
    threads = torch.get_num_threads()
    yield stand_in
    torch.set_num_threads(threads)  # a model sets this process's threads


def model_module(source: Path, monkeypatch, cores: int = 4) -> types.ModuleType:
    """The model file `source`, imported fresh, on `cores` cores."""
    spec = importlib.util.spec_from_file_location(f"model_under_test_{source.parent.parent.name}", source)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "usable_cores", lambda: cores)
    return module


def triton_args(model: str, kind: str = "CPU", device_id: int = 0, groups: list[dict] | None = None) -> dict:
    """Triton's `args` for instance <model>_0_0 of the shipped config, as the local server adapts it
    (KIND_CPU), or with `groups` as its instance groups."""
    config = json_format.MessageToDict(
        TritonConfig.read(MODELS / model / "config.pbtxt").proto, preserving_proto_field_name=True
    )
    config["instance_group"] = groups or [{"count": 1, "kind": f"KIND_{kind}"}]
    return {
        "model_config": json.dumps(config),
        "model_instance_name": f"{model}_0_0",
        "model_instance_kind": kind,
        "model_instance_device_id": str(device_id),
        "model_repository": str(MODELS / model),
    }


def started(model, built_artifacts, backend, monkeypatch, args: dict, cores: int = 4):
    source = ONNX_RUNNER_SOURCE if model == "food_classifier_onnx" else MODELS / model / "1" / "model.py"
    module = model_module(source, monkeypatch, cores)
    if model == "food_classifier_onnx":  # staged as the model's model.py, beside its model.onnx
        monkeypatch.setattr(module, "__file__", str(MODELS / model / "1" / "model.py"))
    instance = module.TritonPythonModel()
    instance.initialize(args)
    return instance


@pytest.mark.parametrize("model", ["food_classifier", "food_sequence"])
@pytest.mark.parametrize("fails", ["moving the model there", "the first inference"])
def test_a_gpu_instance_that_fails_on_its_gpu_runs_on_the_cpu_and_says_why(
    model, fails, built_artifacts, backend, monkeypatch
):
    if fails == "the first inference":  # the model moves to the GPU and fails only once it runs there
        real_to = torch.nn.Module.to
        monkeypatch.setattr(torch.nn.Module, "to", lambda self, device: real_to(self, "cpu"))
    # GPU 99: no machine has it, so the GPU fails on a GPU machine too.
    instance = started(model, built_artifacts, backend, monkeypatch, triton_args(model, "GPU", device_id=99))
    (warned, why), (_, line) = backend.lines
    assert warned == "warn" and why.startswith(
        f"{model} instance {model}_0_0: asked PyTorch for cuda:99, runs on the CPU"
    )
    assert "Its reason: " in why and "\n" not in why  # PyTorch's own words, in one line
    assert f"on cpu (torch {torch.__version__}, INSTEAD OF THE GPU ASKED FOR (cuda:99))" in line
    assert instance.device == "cpu" and next(instance.model.parameters()).device.type == "cpu"
    if model == "food_classifier":  # the GPU check's reader of the line fails it
        assert judge_triton(line, "cuda").status == FAIL and [m["device"] for m in triton_instances(line)] == ["cpu"]


def test_a_cpu_instance_runs_on_the_cpu_proved_by_its_first_inference(built_artifacts, backend, monkeypatch):
    instance = started("food_classifier", built_artifacts, backend, monkeypatch, triton_args("food_classifier"))
    ((level, line),) = backend.lines
    assert level == "info" and line.startswith("food_classifier instance food_classifier_0_0 on cpu (torch ")
    assert ", first inference " in line and instance.device == "cpu"
    assert judge_triton(line, "cpu").status == PASS


def test_a_model_whose_first_inference_fails_on_the_cpu_does_not_start(built_artifacts, backend, monkeypatch):
    monkeypatch.setattr(torch.nn.Module, "__call__", lambda *_: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        started("food_classifier", built_artifacts, backend, monkeypatch, triton_args("food_classifier"))
    assert backend.lines == []  # it never says it started


@pytest.mark.filterwarnings("ignore:Specified provider 'CUDAExecutionProvider' is not in available provider names")
def test_an_onnx_runtime_without_a_cuda_provider_runs_food_refine_on_the_cpu_saying_so(
    built_artifacts, backend, monkeypatch
):
    import onnxruntime

    if "CUDAExecutionProvider" in onnxruntime.get_available_providers():
        pytest.skip("this ONNX Runtime has a CUDA provider: its fallback is the one to test here, on a GPU")
    instance = started("food_refine", built_artifacts, backend, monkeypatch, triton_args("food_refine", "GPU", 1))
    (warned, why), (_, line) = backend.lines
    assert warned == "warn" and "asked ONNX Runtime for cuda:1, runs on the CPU instead" in why
    assert "no CUDA provider it could load" in why
    assert "on cpu (onnxruntime " in line and "(CPUExecutionProvider), INSTEAD OF THE GPU ASKED FOR (cuda:1)" in line
    assert "abandon_on_cancel on" in line and instance.session.get_providers() == ["CPUExecutionProvider"]


@pytest.mark.parametrize(
    ("groups", "threads", "level", "says"),
    [
        ([{"count": 2, "kind": "KIND_CPU"}], 2, "info", "2 thread(s) each, 2 instance(s) on 4 core(s)"),
        ([{"count": 3, "kind": "KIND_CPU"}], 1, "info", "(the cores divided by the instances)"),
        # A GPU group runs its count on each GPU it lists: 2 x 2 + 1 = 5 instances, more than the cores.
        ([{"count": 2, "kind": "KIND_GPU", "gpus": [0, 1]}, {"count": 1}], 1, "warn", "MORE THREADS THAN CORES"),
    ],
    ids=["two", "three", "five-across-two-gpus"],
)
def test_each_instance_gets_the_cores_divided_by_the_config_s_instances(
    groups, threads, level, says, built_artifacts, backend, monkeypatch
):
    monkeypatch.delenv("INFERENCE_THREADS", raising=False)
    started("food_classifier", built_artifacts, backend, monkeypatch, triton_args("food_classifier", groups=groups))
    (logged, line), *_ = [entry for entry in backend.lines if " on cpu (" in entry[1]]
    assert torch.get_num_threads() == threads and logged == level and says in line


@pytest.mark.parametrize("model", ["food_classifier", "food_sequence", "food_refine", "food_classifier_onnx"])
def test_inference_threads_sets_each_instance_s_threads_and_a_bad_value_stops_it_saying_what_to_set(
    model, built_artifacts, backend, monkeypatch
):
    args = triton_args(model, groups=[{"count": 2, "kind": "KIND_CPU"}])
    monkeypatch.setenv("INFERENCE_THREADS", "4")  # 2 instances x 4 threads on 4 cores
    started(model, built_artifacts, backend, monkeypatch, args)
    level, line = backend.lines[-1]
    assert level == "warn" and "4 thread(s) each, 2 instance(s) on 4 core(s) (set by INFERENCE_THREADS)" in line
    assert "MORE THREADS THAN CORES" in line
    monkeypatch.setenv("INFERENCE_THREADS", "many")
    with pytest.raises(TritonModelException, match="INFERENCE_THREADS='many': set it to a whole number"):
        started(model, built_artifacts, backend, monkeypatch, args)


def test_usable_cores_are_the_affinity_capped_by_a_container_s_quota(monkeypatch):
    module = importlib.util.module_from_spec(importlib.util.spec_from_file_location("onnx_runner", ONNX_RUNNER_SOURCE))
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", Backend())
    module.__spec__.loader.exec_module(module)
    monkeypatch.setattr(os, "sched_getaffinity", lambda _: {0, 1, 2, 3})
    for cpu_max, cores in (("250000 100000\n", 2), ("50000 100000\n", 1), ("max 100000\n", 4), (None, 4)):

        def opened(path, text=cpu_max):
            assert path == "/sys/fs/cgroup/cpu.max"
            if text is None:
                raise FileNotFoundError(path)  # no cgroup v2 here
            return io.StringIO(text)

        monkeypatch.setattr(module, "open", opened, raising=False)
        assert module.usable_cores() == cores, cpu_max


def test_cancelled_requests_are_answered_cancelled_and_logged_as_the_reader_counts_them_and_a_bad_image_alone_fails(
    built_artifacts, backend, monkeypatch
):
    instance = started("food_classifier", built_artifacts, backend, monkeypatch, triton_args("food_classifier"))
    photo = make_image_bytes(1)
    requests = [photo_request(photo, photo), photo_request(photo, cancelled=True), photo_request(b"no image here")]
    requests.append(photo_request(photo, cancelled=True))
    first, cancelled, bad, also_cancelled = instance.execute(requests)
    assert first.error is None and first.outputs["FOOD_LABEL"].shape == (2, 1)
    assert first.outputs["PROBABILITY"].dtype == np.float32
    for answer in (cancelled, also_cancelled):
        assert (answer.error.code, answer.error.message) == ("CANCELLED", "cancelled by the client before inference")
    assert "not an image" in bad.error.message
    assert [request.asked for request in requests] == [1, 1, 0, 1]  # once each, after decoding; never for a bad one
    log = "\n".join(line for _, line in backend.lines)
    assert triton_stats.cancelled_by_model(log, "food_classifier") == 2
    assert triton_stats.cancelled_by_model(log, "food_classifier_onnx") == 0
    # Its own stages, timed in Triton's metric, each series labelled as the lab's reader reads them.
    process = str(os.getpid())
    assert {(m.family, m.labels["stage"]) for m in backend.metrics} == {
        ("lab_model_stage_us", "decode"),
        ("lab_model_stage_us", "forward"),
    }
    assert all(
        m.labels == {"model": "food_classifier", "stage": m.labels["stage"], "process": process}
        for m in backend.metrics
    )
    assert all(m.value > 0 for m in backend.metrics)
    instance.finalize()


def test_the_onnx_stand_in_answers_cancelled_requests_cancelled_and_runs_the_rest_in_one_call(
    built_artifacts, backend, monkeypatch
):
    instance = started(
        "food_classifier_onnx", built_artifacts, backend, monkeypatch, triton_args("food_classifier_onnx")
    )
    assert backend.lines[-1][1].startswith(
        "food_classifier_onnx instance food_classifier_onnx_0_0 on cpu (onnxruntime "
    )
    image = np.zeros((1, 3, 224, 224), np.float32)
    requests = [Request(input=np.repeat(image, 2, axis=0)), Request(True, input=image), Request(input=image)]
    runs = []
    real_run = instance.session.run
    monkeypatch.setattr(instance.session, "run", lambda *a: runs.append(a) or real_run(*a), raising=False)
    kept, cancelled, last = instance.execute(requests)
    assert kept.outputs["output"].shape == (2, 11) and last.outputs["output"].shape == (1, 11)
    assert cancelled.error.code == "CANCELLED" and len(runs) == 1 and len(runs[0][1]["input"]) == 3
    assert triton_stats.cancelled_by_model(backend.lines[-1][1], "food_classifier_onnx") == 1
