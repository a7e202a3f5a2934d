"""Queueing theory (servelab.measure.queueing): the waits the lessons compare the measurements with."""

from __future__ import annotations

import itertools
import math

import pytest

from servelab.measure import queueing


def test_md1_known_value_half_load():
    # rho = 50 req/s * 10 ms = 0.5: Wq = 0.5 / (2 * 100/s * 0.5) = 5 ms.
    assert queueing.md1_mean_wait_s(50, 0.010) == pytest.approx(0.005)
    (row,) = queueing.mg1_estimate([50], 0.010, 0.0)
    assert row == pytest.approx({"rate_rps": 50.0, "utilization": 0.5, "queueing_delay_ms": 5.0, "latency_ms": 15.0})


def test_md1_wait_grows_with_load_and_is_infinite_at_capacity():
    waits = [queueing.md1_mean_wait_s(rate, 0.010) for rate in range(0, 100, 5)]
    assert waits[0] == 0
    assert all(a < b for a, b in itertools.pairwise(waits))
    assert queueing.md1_mean_wait_s(100, 0.010) == math.inf
    assert queueing.md1_mean_wait_s(150, 0.010) == math.inf
    assert queueing.capacity_rps(0.010) == pytest.approx(100)


def test_mg1_waits_longer_as_the_service_time_varies_and_is_md1_when_it_does_not():
    # rho = 0.5, S = 10 ms: Wq = 0.5 * 10 ms * (1 + cv2) / (2 * 0.5) = 5 ms * (1 + cv2).
    assert queueing.mg1_mean_wait_s(50, 0.010, 0.0) == pytest.approx(queueing.md1_mean_wait_s(50, 0.010))
    assert queueing.mg1_mean_wait_s(50, 0.010, 1.0) == pytest.approx(0.010)  # M/M/1: twice M/D/1
    (row,) = queueing.mg1_estimate([50], 0.010, 0.5)
    assert row["queueing_delay_ms"] == pytest.approx(7.5) and row["latency_ms"] == pytest.approx(17.5)
    with pytest.raises(ValueError, match="not negative"):
        queueing.mg1_mean_wait_s(50, 0.010, -0.1)


def test_dd1_has_no_queueing_below_saturation():
    assert [queueing.dd1_mean_wait_s(rate, 0.010) for rate in (10, 50, 99, 100)] == [0, 0, 0, 0]
    assert queueing.dd1_mean_wait_s(101, 0.010) == math.inf
    with pytest.raises(ValueError):
        queueing.md1_mean_wait_s(10, 0)
