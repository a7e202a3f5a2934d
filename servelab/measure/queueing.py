"""Queueing models for the arrival-pattern lesson: why latency explodes before 100 % load.

A server that needs S seconds per request can serve at most 1/S requests per second (its
capacity). The models below predict the mean time a request waits in the queue before service,
at an offered rate of lambda requests per second, i.e. at utilization rho = lambda * S:

- M/D/1: random (Poisson) arrivals, constant service time. Requests sometimes arrive in clumps,
  and a clump queues even when the server is idle on average, so waiting grows smoothly with
  load and without bound as rho approaches 1 (Pollaczek-Khinchine formula).
- D/D/1: perfectly regular arrivals, constant service time. Every request arrives after the
  previous one has finished, so nobody waits at all, right up to capacity.

- M/G/1: random arrivals, and a service time that varies, with squared coefficient of variation
  cv2 (variance / mean^2). The wait grows with (1 + cv2): M/D/1 is its cv2 = 0 case, and a server
  whose requests take more or less time queues more at the same load.

Measured latency between M/D/1 and D/D/1 shows how much of the queueing comes from the
*randomness* of arrivals, not from the load itself; measured latency above M/D/1 points at a
service time that varies (M/G/1), or at work outside the service time.

Both models assume one server handling one request at a time in arrival (FIFO) order, an
unlimited queue, and a steady state (a long run). A Triton model with several instances or with
dynamic batching serves requests in parallel or together, so its capacity is higher than 1/S and
these formulas only describe it with S replaced by its effective time per request.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any


def _check(rate_rps: float, service_time_s: float) -> None:
    if service_time_s <= 0:
        raise ValueError(f"service time must be positive, got {service_time_s}")
    if rate_rps < 0:
        raise ValueError(f"arrival rate must not be negative, got {rate_rps}")


def capacity_rps(service_time_s: float) -> float:
    """The most requests per second one server can complete: 1 / S."""
    _check(0.0, service_time_s)
    return 1.0 / service_time_s


def utilization(rate_rps: float, service_time_s: float) -> float:
    """rho = lambda * S = lambda / mu: the fraction of time the server is busy (above 1: overloaded)."""
    _check(rate_rps, service_time_s)
    return rate_rps * service_time_s


def mg1_mean_wait_s(rate_rps: float, service_time_s: float, cv2: float) -> float:
    """Mean queueing delay Wq of M/G/1: Poisson arrivals at `rate_rps`, a service time of mean S
    whose squared coefficient of variation is `cv2`.

    Pollaczek-Khinchine: Wq = rho * S * (1 + cv2) / (2 * (1 - rho)). Infinite at rho >= 1: the
    queue then grows for as long as the load lasts.
    """
    if cv2 < 0:
        raise ValueError(f"a squared coefficient of variation is not negative, got {cv2}")
    rho = utilization(rate_rps, service_time_s)
    if rho >= 1:
        return math.inf
    return rho * service_time_s * (1 + cv2) / (2 * (1 - rho))


def md1_mean_wait_s(rate_rps: float, service_time_s: float) -> float:
    """Mean queueing delay Wq of M/D/1: Poisson arrivals, a constant service time (M/G/1, cv2 = 0):
    Wq = rho / (2 * mu * (1 - rho)), with mu = 1 / S."""
    return mg1_mean_wait_s(rate_rps, service_time_s, 0.0)


def dd1_mean_wait_s(rate_rps: float, service_time_s: float) -> float:
    """Mean queueing delay of D/D/1: arrivals exactly 1/rate apart, constant service time.

    Zero up to capacity, since each request finds the previous one finished. Above it every
    request adds S - 1/rate to the backlog, which grows without bound: infinite.
    """
    rho = utilization(rate_rps, service_time_s)
    return 0.0 if rho <= 1 else math.inf


def _estimate(
    wait_s: Callable[[float, float], float], rates: Iterable[float], service_time_s: float
) -> list[dict[str, Any]]:
    rows = []
    for rate in rates:
        wait = wait_s(rate, service_time_s)
        rows.append(
            {
                "rate_rps": float(rate),
                "utilization": utilization(rate, service_time_s),
                "queueing_delay_ms": wait * 1000,
                "latency_ms": (wait + service_time_s) * 1000,  # time in the system: wait + service
            }
        )
    return rows


def mg1_estimate(rates: Iterable[float], service_time_s: float, cv2: float) -> list[dict[str, Any]]:
    """M/G/1 estimates at each offered rate (M/D/1 at cv2 = 0): rate_rps, utilization,
    queueing_delay_ms, latency_ms."""
    return _estimate(lambda rate, service: mg1_mean_wait_s(rate, service, cv2), rates, service_time_s)
