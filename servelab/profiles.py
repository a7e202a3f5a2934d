"""How long the lab measures: one set of profiles for the notebooks and the benchmark.

`full` is for real runs (a student's notebook, `make bench`); `quick` is for CI, where every
experiment still runs, with short windows, to prove that it works, never to judge speed. The
notebooks take LAB_PROFILE's (servelab.settings; default full); `python -m servelab bench
--profile` picks one too.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Profile:
    name: str
    duration_s: float  # measured seconds of one load-generator run (one load point)
    warmup_s: float  # unmeasured seconds before each
    sequential_requests: int  # requests in a one-at-a-time latency measurement
    perf_window_ms: int  # one perf_analyzer measurement window
    agreement_pairs: int  # the benchmark's alternating load generator / perf_analyzer runs
    step_s: float = 30.0  # one step of a step load: long enough for Ray Serve's autoscaler to act
    # The benchmark's load points: its goals are judged at 64 (servelab.bench.goals), the rest reported.
    concurrencies: tuple[int, ...] = (1, 8, 16, 64)
    # The benchmark measures each load point in this many windows (duration_s in all), each
    # between two measurements of its ceiling: the machine's speed drifts within a run.
    windows: int = 1


PROFILES = {
    "full": Profile(
        "full",
        duration_s=20.0,
        warmup_s=3.0,
        sequential_requests=100,
        perf_window_ms=5000,
        agreement_pairs=3,
        windows=4,
    ),
    "quick": Profile(
        "quick",
        duration_s=2.0,
        warmup_s=0.5,
        sequential_requests=20,
        perf_window_ms=1500,
        agreement_pairs=1,
        # Serve adds a replica within ~7 s of a step's start on a busy 2-core machine (upscale_delay_s 2,
        # look_back_period_s 4 in notebook 9), so a 10 s step still lets it act, or shows that it did not.
        step_s=10.0,
        # One request in flight and the judged load: c=8 and c=16 run the same code as c=64, reported
        # instead of judged (and the full profile measures them); two windows each, so that the
        # pooling of windows is run too.
        concurrencies=(1, 64),
        windows=2,
    ),
}


def profile(name: str) -> Profile:
    """The profile called `name`; an unknown name is an error."""
    if name not in PROFILES:
        raise ValueError(f"no profile {name!r}: use one of {', '.join(sorted(PROFILES))}")
    return PROFILES[name]
