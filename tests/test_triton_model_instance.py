"""The set-up every Python-backend model of the lab does as Triton starts an instance
(servelab.triton.model_instance), with Triton's `args` and logger stood in for."""

from __future__ import annotations

import json
import tempfile
import types

import pytest

from servelab.service import cores
from servelab.service.devices import Placement
from servelab.triton import stats as triton_stats
from servelab.triton.model_instance import cancelled_response, instance_count, set_up_instance


class Logger:
    """Triton's pb_utils.Logger, as the set-up calls it."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, str]] = []

    def log_info(self, message: str) -> None:
        self.lines.append(("info", message))

    def log_warn(self, message: str) -> None:
        self.lines.append(("warn", message))


def triton_args(kind: str = "CPU", device_id: int = 0, groups: list[dict] | None = None) -> tuple[dict, dict]:
    """Triton's `args` for instance food_classifier_0_0, and its config parsed."""
    config = {"name": "food_classifier", "instance_group": groups or [{"count": 2, "kind": f"KIND_{kind}"}]}
    args = {
        "model_config": json.dumps(config),
        "model_instance_name": "food_classifier_0_0",
        "model_instance_kind": kind,
        "model_instance_device_id": str(device_id),
        "model_repository": "/staged/food_classifier",
    }
    return args, config


@pytest.fixture(autouse=True)
def four_cores(monkeypatch, tmp_path):
    monkeypatch.setattr(cores, "available_cores", lambda: 4)
    monkeypatch.delenv("PREDICT_CONCURRENCY", raising=False)
    monkeypatch.delenv("INFERENCE_THREADS", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the instances at work are counted


@pytest.mark.parametrize(
    ("kind", "gpu_by_index", "asked"), [("GPU", True, "cuda:1"), ("GPU", False, "cuda"), ("CPU", True, "cpu")]
)
def test_the_model_is_loaded_on_the_device_triton_gave_the_instance(kind, gpu_by_index, asked):
    args, config = triton_args(kind, device_id=1)
    loaded = []

    def load(device):
        loaded.append(device)
        return "the model", Placement(device, "torch 2", device)

    instance = set_up_instance(args, config, Logger(), load, gpu_by_index=gpu_by_index)
    instance.close()
    assert loaded == [asked] and instance.model == "the model" and instance.placement.device == asked


def test_a_gpu_instance_that_fell_back_says_why_and_plans_its_threads_for_the_cpu():
    args, config = triton_args("GPU")
    logger = Logger()
    fell_back = Placement("cpu", "torch 2", "cuda:0", fallback="no CUDA driver")
    instance = set_up_instance(args, config, logger, lambda device: ("the model", fell_back))
    instance.close()
    assert logger.lines[0][0] == "warn"
    assert logger.lines[0][1].startswith("food_classifier instance food_classifier_0_0: Asked torch for the GPU")
    assert "no CUDA driver" in logger.lines[0][1]
    # Two instances on the CPU's four cores share them out, counted across processes.
    assert (instance.plan.slots, instance.plan.elastic) == (2, True) and instance.running is not None
    assert instance.plan.chosen_by == "set by 2 instance(s) in the config"


def test_on_a_gpu_one_slot_per_instance_and_no_count_across_processes():
    args, config = triton_args("GPU", groups=[{"count": 1, "kind": "KIND_GPU", "gpus": [0]}])
    logger = Logger()
    instance = set_up_instance(args, config, logger, lambda device: ("the model", Placement(device, "torch 2", device)))
    assert logger.lines == [] and instance.running is None and not instance.plan.elastic
    with instance.threads_at_work() as threads:
        assert threads == instance.plan.threads == 4


def test_a_gpu_group_runs_its_count_on_each_gpu_it_lists():
    assert instance_count({"instance_group": [{"count": 2, "gpus": [0, 1]}, {"count": 1}]}) == 5


def test_the_instances_at_work_share_the_cores_and_an_instance_leaves_when_it_closes(tmp_path):
    args, config = triton_args()
    first = set_up_instance(args, config, Logger())  # a model that makes its own sessions: the CPU
    other = set_up_instance({**args, "model_instance_name": "food_classifier_0_1"}, config, Logger())
    assert first.model is None and first.placement is None
    with first.threads_at_work() as alone:
        with other.threads_at_work() as beside:
            assert (alone, beside) == (4, 2)
    members = next(tmp_path.glob("servelab-running-food_classifier-*"))
    first.close()
    other.close()
    assert [path.name for path in members.iterdir()] == [".gate"]


def test_the_started_line_says_where_it_runs_and_its_plan_and_warns_when_crowded(monkeypatch):
    args, config = triton_args()
    logger = Logger()
    instance = set_up_instance(args, config, logger)
    instance.log_started("on cpu (onnxruntime 1.20)")
    instance.close()
    ((level, line),) = logger.lines
    assert level == "info" and line.startswith("food_classifier instance food_classifier_0_0 on cpu (onnxruntime 1.20)")
    assert "; threads: 2 inference slot(s), elastic threads" in line
    monkeypatch.setenv("INFERENCE_THREADS", "4")  # 2 instances of 4 threads on 4 cores
    crowded = Logger()
    instance = set_up_instance(args, config, crowded)
    instance.log_started("on cpu")
    assert crowded.lines[0][0] == "warn" and "MORE THREADS THAN CORES" in crowded.lines[0][1]
    instance.close()


class Request:
    """A request as the Python backend hands it to `execute`, as far as `cancelled` asks it."""

    def __init__(self, cancelled: bool) -> None:
        self.is_cancelled_calls = 0
        self._cancelled = cancelled

    def is_cancelled(self) -> bool:
        self.is_cancelled_calls += 1
        return self._cancelled


def test_cancelled_requests_are_asked_once_each_and_logged_as_the_log_reader_counts_them():
    args, config = triton_args()
    logger = Logger()
    instance = set_up_instance(args, config, logger)
    requests = [Request(False), Request(True), Request(True)]
    assert instance.cancelled(requests) == [False, True, True]
    assert [request.is_cancelled_calls for request in requests] == [1, 1, 1]  # a round trip each, once
    assert instance.cancelled([Request(False)]) == [False]  # none cancelled: nothing logged
    instance.close()
    ((level, line),) = logger.lines
    assert level == "info"
    assert triton_stats.cancelled_by_model(line + "\n", "food_classifier") == 2
    assert triton_stats.cancelled_by_model(line + "\n", "food_classifier_onnx") == 0


def test_a_cancelled_request_is_answered_with_tritons_cancelled_error():
    class TritonError:
        CANCELLED = "CANCELLED"

        def __init__(self, message: str, code: str) -> None:
            self.message, self.code = message, code

    class InferenceResponse:
        def __init__(self, error: TritonError) -> None:
            self.error = error

    backend = types.SimpleNamespace(InferenceResponse=InferenceResponse, TritonError=TritonError)
    answer = cancelled_response(backend)
    assert isinstance(answer, InferenceResponse) and answer.error.code == "CANCELLED"
    assert answer.error.message == "cancelled by the client before inference"
