"""Notebook 4's checks, each fed a case it must pass and one it must fail."""

from servelab.lessons import fastapi_bench
from servelab.lessons.expectations import Outcome
from tests.helpers import service_stages, synthetic_run


def outcomes(expectation) -> list[Outcome]:
    return [part.outcome for part in expectation.conditions]


def test_onnx_faster_than_pytorch_holds_and_fails_on_its_two_figures_and_its_reason_reads_the_inference_times():
    pytorch = synthetic_run("fastapi_pt", throughput_rps=30, mean_ms=33, service_stats=service_stages(inference=25))
    onnx = synthetic_run("fastapi_onnx", throughput_rps=90, mean_ms=11, service_stats=service_stages(inference=6))
    held = fastapi_bench.runtime_comparison(pytorch, onnx, "2 CPU cores")
    assert held.outcome is Outcome.HELD
    assert "25.0 ms in PyTorch and 6.0 ms in ONNX" in held.reason
    # A slower ONNX service: both conditions fail on their own figures.
    slower = synthetic_run("fastapi_onnx", throughput_rps=25, mean_ms=40, service_stats=service_stages(inference=30))
    failed = fastapi_bench.runtime_comparison(pytorch, slower, "2 CPU cores")
    assert outcomes(failed) == [Outcome.NOT_HELD, Outcome.NOT_HELD]


def loaded_run(throughput_rps: float, mean_ms: float, **stages: float):
    return synthetic_run("fastapi_onnx", 16, throughput_rps, mean_ms, service_stats=service_stages(**stages))


ALONE = synthetic_run("fastapi_onnx", 1, throughput_rps=80, mean_ms=12.5)


def test_queueing_holds_when_the_slots_are_full_and_most_of_the_time_is_the_wait_for_them():
    # 160 req/s x 12 ms = 1.92 of 2 slots in use; 80 of 100 ms waiting for a slot.
    held = fastapi_bench.queueing_under_load(ALONE, loaded_run(160, 100, inference=12, slot_wait=80), 2, "cpu")
    assert held.outcome is Outcome.HELD, held
    assert "1.92 of 2 slot(s)" in held.conditions[1].detail


def test_queueing_fails_on_idle_slots_and_on_a_latency_that_is_stretched_service_not_waiting():
    # Throughput no higher than alone, slots idle half the time (80 x 12 ms = 0.96 of 2), and the
    # extra latency spent in stretched stages rather than waiting: every condition fails.
    failed = fastapi_bench.queueing_under_load(ALONE, loaded_run(80, 200, inference=12, slot_wait=40), 2, "cpu")
    assert outcomes(failed) == [Outcome.NOT_HELD] * 3
    assert "in use 48% of the time" in failed.reason


def test_queueing_is_not_checked_when_the_service_timed_nothing():
    run = loaded_run(160, 100, inference=float("nan"), slot_wait=float("nan"))
    assert outcomes(fastapi_bench.queueing_under_load(ALONE, run, 2, "cpu"))[1:] == [Outcome.NOT_CHECKED] * 2
