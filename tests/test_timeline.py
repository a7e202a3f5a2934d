"""A run cut into windows on a time axis."""

import math

import pytest

from servelab.measure.timeline import windows
from servelab.results import LatencySummary, RunResult


def _run(timeline: list[list], wall_s: float) -> RunResult:
    answered = [latency for _, latency, outcome in timeline if outcome == "ok"]
    return RunResult(
        "x",
        "loadgen",
        "closed",
        len(timeline),
        len(answered) / wall_s,
        LatencySummary.of(answered),
        wall_s,
        concurrency=2,
        timeline=timeline,
    )


def test_requests_fall_in_the_window_they_ended_in_with_their_own_percentiles_and_errors():
    timeline = [[0.1, 10.0, "ok"], [0.5, 30.0, "ok"], [0.9, 2.0, "http_503"], [1.2, 100.0, "ok"], [1.4, 200.0, "ok"]]
    first, second = windows(_run(timeline, 2.0), 1.0, offset_s=10.0)
    assert (first.start_s, first.end_s, second.start_s, second.end_s) == (10.0, 11.0, 11.0, 12.0)
    assert (first.answered, first.errors, first.p50_ms) == (2, {"http_503": 1}, 20.0)
    assert math.isnan(first.p95_ms)  # two requests say nothing about the slowest 5%
    assert (second.answered, second.errors, second.p50_ms, second.throughput_rps) == (2, {}, 150.0, 2.0)


def test_a_request_answered_after_the_end_counts_in_the_last_window_and_a_short_last_window_is_short():
    first, last = windows(_run([[0.2, 5.0, "ok"], [1.6, 5.0, "ok"], [1.7, 5.0, "ok"]], 1.5), 1.0)
    assert (first.answered, last.answered, last.end_s) == (1, 2, 1.5)
    assert last.throughput_rps == pytest.approx(4.0)


def test_a_run_without_a_timeline_is_refused():
    run = _run([[0.1, 1.0, "ok"]], 1.0)
    run.timeline = []
    with pytest.raises(ValueError, match="no timeline"):
        windows(run, 1.0)
