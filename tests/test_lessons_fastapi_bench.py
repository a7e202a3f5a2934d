"""Notebook 4's checks, each fed a case it must pass and one it must fail."""

from servelab import paths
from servelab.lessons import fastapi_bench
from servelab.lessons.expectations import Outcome
from servelab.service import food11
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


SHOWN_AS_NAMED = {"bread.jpg": ("Bread", "61.0% probability"), "fried_egg.jpg": ("Egg", "48.2% probability"),
                  "soup.jpg": ("Soup", "90.5% probability")}  # fmt: skip


def test_every_bundled_sample_is_named_for_a_food11_class():
    samples = sorted(path.name for path in (paths.GOURMETGRAM_DIR / "static" / "samples").glob("*.jpg"))
    assert samples == sorted(fastapi_bench.SAMPLE_LABELS)
    assert set(fastapi_bench.SAMPLE_LABELS.values()) <= set(food11.LABELS)


def test_samples_labelled_as_named_hold_on_trained_weights_and_a_miss_fails_that_photo_alone():
    held = fastapi_bench.samples_get_their_labels(SHOWN_AS_NAMED, "trained")
    assert outcomes(held) == [Outcome.HELD] * 3
    assert str(held.conditions[1]) == "  - HELD: fried_egg.jpg is labelled Egg: shown Egg, probability 48.2 %"
    missed = fastapi_bench.samples_get_their_labels({**SHOWN_AS_NAMED, "bread.jpg": ("Dessert", "37.0%")}, "trained")
    assert outcomes(missed) == [Outcome.NOT_HELD, Outcome.HELD, Outcome.HELD]
    assert "shown Dessert, probability 37.0 %" in str(missed.conditions[0])
    assert "1 of 3 samples got another label" in str(missed)


def test_samples_are_not_checked_on_untrained_weights_and_say_why():
    judged = fastapi_bench.samples_get_their_labels(SHOWN_AS_NAMED, "untrained")
    assert outcomes(judged) == [Outcome.NOT_CHECKED] * 3
    assert all(part.detail == "untrained weights: the labels mean nothing" for part in judged.conditions)
