"""Notebook 8's check, fed a case it must pass and ones it must fail."""

from servelab.lessons import io_vs_compute
from servelab.lessons.expectations import Outcome, measured
from tests.helpers import service_stages, synthetic_run
from tests.helpers.lessons import outcomes


def run(senders: int, throughput_rps: float, download: float, slot_wait: float, inference: float = 8.0):
    stages = service_stages(download=download, slot_wait=slot_wait, preprocess=4.0, inference=inference)
    return synthetic_run("fastapi_onnx", senders, throughput_rps, 1000 * senders / throughput_rps, service_stats=stages)


# A 50 ms download: inside the slot 1 / (D + decode + S) = 1000 / 62 = 16 req/s whatever the senders;
# outside, downloads overlap and the slot (S = 8 ms) fills.
INSIDE = {1: run(1, 15, 50, 0), 4: run(4, 16, 50, 180), 16: run(16, 16, 50, 930)}
OUTSIDE = {1: run(1, 15, 50, 0), 4: run(4, 60, 50, 2), 16: run(16, 110, 50, 60), 18: run(18, 112, 50, 90)}


def test_the_designs_as_predicted_hold_every_condition():
    held = io_vs_compute.slot_holds_only_inference(INSIDE, OUTSIDE, 18, 50, "2 CPU cores")
    assert outcomes(held) == [Outcome.HELD] * 4, held
    assert held.conditions[1].detail == "1 / (D + S) = 17.2 req/s"
    assert held.estimate is not None and held.estimate.value == 110 / 16  # outside over inside, 16 senders


def test_a_service_that_ignores_the_inside_placement_fails_the_first_condition():
    # Downloads overlapping although the slot should hold them: throughput grows with the senders.
    overlapping = {1: run(1, 15, 50, 0), 4: run(4, 60, 50, 2), 16: run(16, 110, 50, 60)}
    failed = io_vs_compute.slot_holds_only_inference(overlapping, OUTSIDE, 18, 50, "2 CPU cores")
    assert outcomes(failed)[0] is Outcome.NOT_HELD
    assert failed.conditions[0].detail == "+83%"


def test_an_idle_slot_outside_and_no_longer_wait_inside_fail_their_conditions():
    starved = {**OUTSIDE, 16: run(16, 15, 50, 950), 18: run(18, 40, 50, 2)}
    failed = io_vs_compute.slot_holds_only_inference(INSIDE, starved, 18, 50, "2 CPU cores")
    assert outcomes(failed)[1:] == [Outcome.NOT_HELD] * 3  # below the bound; busy 48%; waits 950 vs 930
    assert "busy 48%" in failed.conditions[2].detail


def test_a_download_too_short_to_matter_leaves_the_designs_comparison_not_checked():
    # A 0.5 ms download beside an 8 ms inference: inside or outside the slot, the limit is the same.
    points = ((1, 70, 0), (4, 110, 20), (16, 112, 130))
    quick = {senders: run(senders, rate, 0.5, wait) for senders, rate, wait in points}
    quick_out = {**quick, 18: run(18, 112, 0.5, 150)}
    judged = io_vs_compute.slot_holds_only_inference(quick, quick_out, 18, 0.5, "2 CPU cores")
    assert [outcomes(judged)[i] for i in (1, 3)] == [Outcome.NOT_CHECKED] * 2
    assert "under a tenth of an inference" in judged.conditions[1].detail


# Truss's case: 10 requests at once on 5 slots. Each downloads (D = 200 ms) and decodes (P = 20 ms)
# at once; the first 5 take the slots, the other 5 wait one inference each (S = 60 ms): W = 30 ms.
def burst(wait: float, sent: int = 10, answered: int = 10):
    stats = service_stages(download=200, slot_wait=wait, preprocess=20, inference=60)
    stats["stage_counts"] = {"download": answered, "slot_wait": answered, "preprocess": answered, "inference": answered}
    return synthetic_run("fastapi_onnx", sent, 10, 300, service_stats=stats, requests=sent)


FIVE = measured("slots", 5)


def test_a_burst_on_five_slots_as_predicted_holds_every_condition():
    held = io_vs_compute.burst_waits_only_for_slots(burst(28), 10, FIVE)
    assert outcomes(held) == [Outcome.HELD] * 3, held
    assert held.conditions[1].detail == "(S x 0.50) / 2 = 15.0 ms"
    assert held.estimate is not None and (held.estimate.value, held.estimate.unit) == (28.0, "ms")


def test_downloads_held_behind_the_slots_fail_the_third_condition():
    # Only 5 download and decode at once: the other 5 wait for D + P + S, W = 0.5 x 280 ms.
    failed = io_vs_compute.burst_waits_only_for_slots(burst(140), 10, FIVE)
    assert outcomes(failed) == [Outcome.HELD, Outcome.HELD, Outcome.NOT_HELD]
    assert failed.conditions[2].detail == "(S + D / 2) x 0.50 = 80.0 ms"


def test_more_than_five_inferring_at_once_fails_the_second_condition():
    failed = io_vs_compute.burst_waits_only_for_slots(burst(0.3), 10, FIVE)
    assert outcomes(failed) == [Outcome.HELD, Outcome.NOT_HELD, Outcome.HELD]


def test_requests_lost_on_the_way_fail_the_first_condition():
    failed = io_vs_compute.burst_waits_only_for_slots(burst(28, answered=8), 10, FIVE)
    assert outcomes(failed)[0] is Outcome.NOT_HELD


def test_no_more_requests_than_slots_leaves_the_waits_not_checked():
    unchecked = io_vs_compute.burst_waits_only_for_slots(burst(0.2, sent=4, answered=4), 4, FIVE)
    assert outcomes(unchecked) == [Outcome.HELD, Outcome.NOT_CHECKED, Outcome.NOT_CHECKED]
    assert unchecked.conditions[1].detail == "4 requests for 5 slots: none has to wait for one"


def test_queued_waits_counts_the_inferences_each_request_waits_for():
    assert io_vs_compute.queued_waits(10, 5) == 0.5
    assert io_vs_compute.queued_waits(4, 5) == 0
    assert io_vs_compute.queued_waits(6, 2) == 1.0  # 0, 0, 1, 1, 2, 2


def test_the_slots_as_a_number_are_judged_as_the_figure_slots():
    held = io_vs_compute.burst_waits_only_for_slots(burst(28), 10, 5)
    assert outcomes(held) == [Outcome.HELD] * 3, held
    assert held.conditions[1].figures[-1] == FIVE


def test_enough_senders_is_half_again_what_keeps_the_slot_busy_within_its_bounds():
    # D + decoding + S = 50 + 4 + 8 = 62 ms, 8 of it in the slot: 7.75 in flight, half again 11.6 -> 12.
    assert io_vs_compute.enough_senders(run(1, 15, 50, 0)) == 12
    assert io_vs_compute.enough_senders(run(1, 15, 50, 0), at_least=16) == 16
    # A 1 s download beside a 1 ms inference would call for 1,508 senders: capped.
    assert io_vs_compute.enough_senders(run(1, 1, 1000, 0, inference=1.0)) == 128
