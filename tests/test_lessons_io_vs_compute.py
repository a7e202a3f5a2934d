"""Notebook 7's check, fed a case it must pass and ones it must fail."""

from servelab.lessons import io_vs_compute
from servelab.lessons.expectations import Outcome
from tests.helpers import service_stages, synthetic_run


def run(senders: int, throughput_rps: float, download: float, slot_wait: float, inference: float = 8.0):
    stages = service_stages(download=download, slot_wait=slot_wait, preprocess=4.0, inference=inference)
    return synthetic_run("fastapi_onnx", senders, throughput_rps, 1000 * senders / throughput_rps,
                         service_stats=stages)  # fmt: skip


def outcomes(expectation) -> list[Outcome]:
    return [part.outcome for part in expectation.conditions]


# A 50 ms download: inside the slot 1 / (D + decode + S) = 1000 / 62 = 16 req/s whatever the senders;
# outside, downloads overlap and the slot (S = 8 ms) fills.
INSIDE = {1: run(1, 15, 50, 0), 4: run(4, 16, 50, 180), 16: run(16, 16, 50, 930)}
OUTSIDE = {1: run(1, 15, 50, 0), 4: run(4, 60, 50, 2), 16: run(16, 110, 50, 60), 18: run(18, 112, 50, 90)}


def test_the_designs_as_predicted_hold_every_condition():
    held = io_vs_compute.slot_holds_only_inference(INSIDE, OUTSIDE, 18, 50, "2 CPU cores")
    assert outcomes(held) == [Outcome.HELD] * 4, held
    assert held.conditions[1].detail == "1 / (D + S) = 17.2 req/s"


def test_a_service_that_ignores_the_inside_placement_fails_the_first_condition():
    # Downloads overlapping although the slot should hold them: throughput grows with the senders.
    overlapping = {1: run(1, 15, 50, 0), 4: run(4, 60, 50, 2), 16: run(16, 110, 50, 60)}
    failed = io_vs_compute.slot_holds_only_inference(overlapping, OUTSIDE, 18, 50, "2 CPU cores")
    assert outcomes(failed)[0] is Outcome.NOT_HELD
    assert failed.conditions[0].detail == "+83%"


def test_an_idle_slot_outside_and_no_longer_wait_inside_fail_their_conditions():
    starved = {**OUTSIDE, 16: run(16, 15, 50, 950), 18: run(18, 40, 50, 2)}
    failed = io_vs_compute.slot_holds_only_inference(INSIDE, starved, 18, 50, "2 CPU cores")
    assert outcomes(failed)[1:] == [Outcome.NOT_HELD] * 3  # below the bound; busy 32%; waits 950 vs 930
    assert "busy 32%" in failed.conditions[2].detail
