"""The appendix's check (notebooks/appendix_triton_crash.py): Triton 2.51's gRPC cancellation race,
judged on what the race probe saw at two deadlines (`RaceProbe`, one per deadline, which
servelab.lessons.cancellation.experiment's `cancellation_probe` returns).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from servelab.lessons.expectations import Condition, Expectation, condition, figure, measured, not_checked
from servelab.results import RunResult

# The steps of Triton's verbose log at which a cancellation is handled as its answer completes.
AS_THE_ANSWER_COMPLETES = ("COMPLETE", "FINISH")


@dataclass(frozen=True)
class RaceProbe:
    """What one deadline of the race probe saw: the requests its clients gave up (`cancelled`),
    the step at which the server handled each cancellation, read from its verbose log (`steps`:
    START, ISSUED, COMPLETE, FINISH; empty where there was no log to read), and the crash (or hang)
    that ended it, if any."""

    cancelled: int
    steps: dict[str, int] = field(default_factory=dict)
    crash: str | None = None

    @property
    def handled(self) -> int:
        return sum(self.steps.values())

    @property
    def near(self) -> int:
        """Cancellations handled as their answer completed."""
        return sum(self.steps.get(step, 0) for step in AS_THE_ANSWER_COMPLETES)

    @property
    def near_share(self) -> float:
        return self.near / self.handled if self.handled else math.nan

    @property
    def crashed(self) -> bool:
        return self.crash is not None


def _share_noise(one: RaceProbe, other: RaceProbe) -> float:
    """Twice the standard error of the difference of the two shares handled as the answer
    completed, were both drawn from the same share (their pooled one): how far apart two probes of
    one deadline may land by chance, with as few cancellations as these handled."""
    pooled = (one.near + other.near) / (one.handled + other.handled)
    return 2 * math.sqrt(pooled * (1 - pooled) * (1 / one.handled + 1 / other.handled))


def _no_cancellation(probes: dict[str, RaceProbe], logged: bool) -> str:
    """Why a deadline's probe says nothing of the race, or "" where each had cancellations (and,
    where `logged`, some the server's log shows handled)."""
    for deadline, probe in probes.items():
        if not probe.cancelled:
            return f"no client gave up {deadline} (0 cancelled): there was no cancellation to race"
        if logged and not probe.handled:
            return (
                f"the server's log shows none of the {probe.cancelled} cancellations {deadline} handled (no "
                "verbose log to read): a share of nothing says nothing"
            )
    return ""


def triton_cancellation_race(
    alone: RunResult,
    lesson: RaceProbe,
    at_s: RaceProbe,
    version: tuple[int, ...],
    fixed_in: tuple[int, ...],
    probe_s: float,
    cores: int,
) -> Expectation:
    """Triton's gRPC cancellation race (fixed in `fixed_in`), probed at two deadlines on a Triton
    of `version`: the lesson's (`lesson`: clients giving up while patient ones are queued ahead of
    them) and the service time (`at_s`: two clients alone, giving up after `alone`'s median latency,
    as their answer is often being completed). The shares handled as the answer completes (COMPLETE
    or FINISH) must differ by more than twice their standard error (`_share_noise`). Wrong outcomes:
    the deadlines reach the server at the same steps (the probe's contrast, which the race needs, is
    not there); the race missed within `probe_s`, or a fixed release crashed all the same; the
    lesson's own deadline crashed the server too. Each condition is NOT CHECKED where the deadlines
    it reads saw no cancellation (for the shares, also none handled in the server's log): then the
    shares are meaningless, and no crash says nothing of the race."""
    has_race = tuple(version) < tuple(fixed_in)
    deadlines = {"at the service time": at_s, "at the lesson's deadline": lesson}
    shares = [
        measured(f"share as the answer completed, {deadline}", 100 * probe.near_share, "%")
        for deadline, probe in deadlines.items()
    ]
    handled = [measured(f"cancellations handled, {deadline}", probe.handled) for deadline, probe in deadlines.items()]
    noise = _share_noise(at_s, lesson) if at_s.handled and lesson.handled else math.nan
    difference = at_s.near_share - lesson.near_share

    def if_cancelled(probes: dict[str, RaceProbe], judged: Condition, logged: bool = False) -> Condition:
        why = _no_cancellation(probes, logged)
        return not_checked(judged.text, why, *judged.figures) if why else judged

    crashes = {deadline: measured(f"crashes {deadline}", probe.crashed) for deadline, probe in deadlines.items()}
    cancelled = {deadline: measured(f"cancelled {deadline}", probe.cancelled) for deadline, probe in deadlines.items()}
    return Expectation(
        f"Triton {'.'.join(map(str, version))}: cancellations handled as their answer completes "
        + ("race, and crash the server" if has_race else "no longer crash the server (the fix)"),
        (
            if_cancelled(
                deadlines,
                condition(
                    "at the service-time deadline, a larger share of cancellations is handled as the answer "
                    "completes, by more than twice the standard error of the two shares",
                    difference > noise,
                    *shares,
                    *handled,
                    detail=f"{100 * difference:+.1f} points, against {100 * noise:.1f} of noise",
                ),
                logged=True,
            ),
            if_cancelled(
                {"at the service time": at_s},
                condition(
                    "the server crashed (or hung) at the service-time deadline"
                    if has_race
                    else "it did not crash at the service time",
                    at_s.crashed == has_race,
                    crashes["at the service time"],
                    cancelled["at the service time"],
                    figure(alone, "latency.p50_ms", "a request alone: the service-time deadline"),
                ),
            ),
            if_cancelled(
                {"at the lesson's deadline": lesson},
                condition(
                    "it did not crash at the lesson's deadline",
                    not lesson.crashed,
                    crashes["at the lesson's deadline"],
                    cancelled["at the lesson's deadline"],
                ),
            ),
        ),
        reason=(
            "a hypothesis, not measured here: the race needs an answer to be completed inside the moment a "
            "cancellation waits for the server's gRPC thread, which depends on how busy this machine's "
            f"{cores} core(s) are, so within {probe_s:g} s it can miss, or hit the lesson's deadline too "
            f"({at_s.cancelled} and {lesson.cancelled} cancelled at the service time and the lesson's deadline)"
        ),
    )
