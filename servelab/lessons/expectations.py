"""The lesson checks: what a lesson expects to see, and whether this run's numbers bore it out.

A notebook states an expectation in prose before it measures, then records it here as the
conditions it states, each judged on its own numbers:

    queue = {name: figure(result, "server_ms(queue)", f"queue at {name}") for name, result in runs.items()}
    lab.expect(
        "queueing grows with concurrency while compute stays about the same",
        condition("the queue grows with the clients", queue["c=1"].value < queue["c=8"].value, *queue.values()),
        condition(...),
        reason="why it may not hold here, computed from this run",
    )

A `Figure` is a number read from a run (`RunResult`), with the run and the field it came from, so
a verdict can be checked against the tables printed beside it and the runs the notebook saved
(`verdict_problems`, which `lab.verdicts()` runs at the end of every judging notebook). A
condition whose run gave no number (a `None` result), or whose run a crashed service
interrupted, is NOT CHECKED, never counted as held or not held; so is one whose premise did not
arise in this run (nothing was cancelled, nothing queued, a single replica ran), built with
`not_checked` and the reason: a condition that holds only because its situation never happened
(0 wasted of 0 cancelled) says nothing. Every NOT CHECKED condition says why, in its table line
and in the verdict list.

An expectation recorded with `must_hold=True` is a claim about what the lab's software does (Serve
spreads replicas over two nodes), not about speed: where it does not hold, the lab is broken.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from servelab.lessons.predictions import (  # noqa: F401 (AnswerError, NotAsked: the checks import them from here)
    NOT_ASKED,
    AnswerError,
    Estimate,
    NotAsked,
    Prediction,
    PredictionError,
    checked_prediction,
    prediction_said,
)
from servelab.measure.resources import summarize
from servelab.results import RunResult, saved_fields
from servelab.service.cores import available_cores
from servelab.service.hardware import machine_info


def machine_cores() -> int:
    """The CPU cores the checks' reasons count: what this process may use (the notebook's: in the
    Compose project, the Jupyter container's), read where the check runs, never assumed."""
    return available_cores()


@functools.cache
def machine_gpus() -> tuple[str, ...]:
    """The GPUs of the notebook's machine (nvidia-smi's names), none on a CPU-only machine."""
    return tuple(gpu for gpu in machine_info()["gpus"] if gpu != "none")


def machine_hardware() -> str:
    """What the models run on, in words, for the reasons the checks give: a check takes it (and
    `machine_cores`) as its `hardware` (`cores`) argument where a test sets it, and reads it here
    where a notebook leaves it out."""
    cores, gpus = machine_cores(), machine_gpus()
    if gpus:
        return f"{len(gpus)} GPU(s) ({', '.join(sorted(set(gpus)))}) and {cores} CPU cores"
    return f"{cores} CPU core(s) and no GPU"


class Outcome(Enum):
    HELD = "HELD"
    NOT_HELD = "DID NOT HOLD"
    NOT_CHECKED = "NOT CHECKED"


UNITS = {"throughput_rps": "req/s", "images_per_s": "images/s", "requests": "requests", "batch": ""}


@dataclass(frozen=True)
class Figure:
    """A number a verdict used: its value, and where it came from."""

    name: str  # how the evidence calls it, e.g. "queue at c=8"
    value: float
    run: str | None  # the label of the run it was read from; None: measured in the notebook itself
    started_at: str | None = None  # with `run`, tells two runs with the same label apart
    field: str | None = None  # the field of the run, see `read`
    unit: str = ""
    interrupted: bool = False  # read from a run that a service's crash interrupted

    def __str__(self) -> str:
        if math.isnan(self.value):
            return f"{self.name}: not measured"
        digits = 2 if abs(self.value) < 10 else 1 if abs(self.value) < 1000 else 0
        return f"{self.name} {self.value:.{digits}f}{' ' + self.unit if self.unit else ''}"


def _unit(field: str) -> str:
    parts = field.split(".")
    if field.startswith(("latency.", "server_ms(")) or any(p.endswith("_ms") or "_ms_" in p for p in parts):
        return "ms"
    if any(part.endswith("_us") for part in parts):
        return "us"
    if field.startswith("resources."):
        return "% of a core" if "process" in field else "% of all cores"
    return UNITS.get(field.split(".")[-1], "")


def read(result: RunResult, field: str) -> float:
    """One figure of a run: an attribute ("throughput_rps"), a nested one ("latency.p50_ms",
    "triton_stats.avg_batch_size"), Triton's breakdown ("server_ms(queue)"), or what
    `resources.summarize` reports of the run's resources ("resources.cpu_percent_mean",
    "resources.processes.food_classifier_0_0", "resources.gpus.0.util_percent_mean"), or a FastAPI
    service's own stage times over the run ("service_stats.stage_mean_ms.download")."""
    if match := re.fullmatch(r"server_ms\((\w+)\)", field):
        return result.server_ms(match.group(1))
    head, _, rest = field.partition(".")
    if head != "resources":
        value: Any = getattr(result, head)
    elif result.resources is None:
        raise ValueError(f"{result.label}: no resources were sampled during this run, so it has no {field}")
    else:
        value = summarize(result.resources)
    for part in rest.split(".") if rest else ():
        if isinstance(value, dict):
            # A batch size is an int key in a run as measured, a string once saved as JSON.
            value = value[int(part)] if part not in value and part.isdigit() else value[part]
        elif isinstance(value, list):  # a GPU of the run's resources, by its place ("resources.gpus.0...")
            value = value[int(part)]
        else:
            value = getattr(value, part)
    return float(value)


def figure(result: RunResult | None, field: str, name: str) -> Figure:
    """`field` of `result` as a Figure called `name`; of a missing run (None), a NaN that makes
    every condition using it NOT CHECKED."""
    if result is None:
        return Figure(name, math.nan, None, None, field, _unit(field))
    return Figure(name, read(result, field), result.label, result.started_at, field, _unit(field), not result.clean)


def measured(name: str, value: float, unit: str = "") -> Figure:
    """A number the notebook measured itself, not read from a run (a health-check median, say)."""
    return Figure(name, float(value), None, None, None, unit)


@dataclass(frozen=True)
class Condition:
    """One condition an expectation states, judged on its own figures."""

    text: str
    outcome: Outcome
    figures: tuple[Figure, ...]
    detail: str = ""  # a derived number worth saying ("13.9x"), computed from the figures

    def __str__(self) -> str:
        evidence = ", ".join(str(item) for item in self.figures) + (f" ({self.detail})" if self.detail else "")
        return f"  - {self.outcome.value}: {self.text}: {evidence}"


def condition(text: str, held: bool, *figures: Figure, detail: str = "") -> Condition:
    """`text` judged `held` on `figures`; NOT CHECKED when one of them was not measured, or was
    measured in a run that a crashed service interrupted (its table row says which)."""
    if missing := [item.name for item in figures if math.isnan(item.value)]:
        return Condition(text, Outcome.NOT_CHECKED, figures, f"not measured: {', '.join(missing)}")
    if interrupted := [item.name for item in figures if item.interrupted]:
        return Condition(text, Outcome.NOT_CHECKED, figures, f"a service crashed during the run of {interrupted[0]}")
    return Condition(text, Outcome.HELD if held else Outcome.NOT_HELD, figures, detail)


def not_checked(text: str, why: str, *figures: Figure) -> Condition:
    """`text`, NOT CHECKED because its premise did not arise in this run (`why`, computed from
    `figures`, which show it): judging it would pass or fail on a situation that never happened."""
    if not why:
        raise ValueError(f"{text!r}: a condition NOT CHECKED says why")
    return Condition(text, Outcome.NOT_CHECKED, figures, why)


def unless(premise: bool, why: str, judged: Condition) -> Condition:
    """`judged` where its `premise` arose in this run; else the same condition NOT CHECKED,
    with `why` and its figures."""
    return judged if premise else not_checked(judged.text, why, *judged.figures)


def unless_each(premise: bool, why: str, *judged: Condition, shown: Sequence[Figure] = ()) -> tuple[Condition, ...]:
    """`unless` for conditions that share one premise; NOT CHECKED, each shows `shown` where given (the
    figures that show the premise did not arise), else its own."""
    return tuple(item if premise else not_checked(item.text, why, *(shown or item.figures)) for item in judged)


@dataclass(frozen=True)
class Expectation:
    claim: str
    conditions: tuple[Condition, ...]
    reason: str = ""  # why it may not hold here; shown only when a condition did not hold
    must_hold: bool = False  # a claim about what the lab's software does: not holding is a fault of the lab
    # The student's prediction, written before the run: a number (of `estimate`), whether the claim
    # holds (True/False) where it has no number, or in their own words; None: asked, left empty.
    predicted: Prediction = NOT_ASKED
    estimate: Estimate | None = None  # the number a prediction is compared with, where the claim has one

    @property
    def outcome(self) -> Outcome:
        outcomes = {item.outcome for item in self.conditions}
        for worst in (Outcome.NOT_HELD, Outcome.NOT_CHECKED):
            if worst in outcomes:
                return worst
        return Outcome.HELD

    def __str__(self) -> str:
        lines = [f"Expectation: {self.claim}", f"  -> {self.outcome.value} on this machine:"]
        lines += [str(item) for item in self.conditions]
        if self.reason and self.outcome is Outcome.NOT_HELD:
            lines.append(f"  Why: {self.reason}")
        if said := self.prediction_said():
            lines.append(f"  {said}")
        return "\n".join(lines)

    def prediction_said(self) -> str:
        """The student's prediction beside the outcome (empty where the lesson asked for none)."""
        held = None if self.outcome is Outcome.NOT_CHECKED else self.outcome is Outcome.HELD
        return prediction_said(self.claim, self.predicted, self.estimate, held)


class ExpectationLog(list):
    """Every expectation a notebook recorded, in order. A prediction typed in a form its check cannot
    judge (`checked_prediction`) raises a PredictionError, and nothing of it is recorded."""

    def record(
        self,
        claim: str,
        conditions: tuple[Condition, ...],
        reason: str = "",
        must_hold: bool = False,
        predicted: Prediction = NOT_ASKED,
        estimate: Estimate | None = None,
    ) -> Expectation:
        predicted = checked_prediction(claim, predicted, estimate)
        expectation = Expectation(claim, tuple(conditions), reason, must_hold, predicted, estimate)
        self.append(expectation)
        print(expectation)
        return expectation

    def summary(self) -> str:
        """One line per expectation, and one per condition: the verdict list at a notebook's end."""
        width = max(len(outcome.value) for outcome in Outcome)
        lines = []
        for item in self:
            lines.append(f"{item.outcome.value:>{width}}: {item.claim}")
            if said := item.prediction_said():
                lines.append(f"{'':>{width}}    {said}")
            for part in item.conditions:
                why = f" ({part.detail})" if part.outcome is Outcome.NOT_CHECKED and part.detail else ""
                if len(item.conditions) > 1:
                    lines.append(f"{'':>{width}}    {part.outcome.value}: {part.text}{why}")
                elif why:
                    lines.append(f"{'':>{width}}    why: {part.detail}")
        return "\n".join(lines)

    def figures(self) -> list[Figure]:
        """Every figure every verdict used."""
        return [item for expectation in self for part in expectation.conditions for item in part.figures]


class LabFault(RuntimeError):
    """The lab's own software is wrong, not the measurement: a verdict that says something its
    table does not, or a claim about what the lab's software does that did not hold."""


def _identity(run: RunResult) -> tuple[str, str]:
    """What tells a run apart from the others of its notebook: its label and when it started."""
    return run.label, run.started_at


def _compare_saved(
    results: Sequence[RunResult], saved: Sequence[RunResult]
) -> tuple[list[str], dict[tuple[str, str], RunResult]]:
    """Each way the saved runs differ from the runs of the table, every field compared as saved
    (`saved_fields`); and the saved runs equal to their table's, by identity."""
    if [_identity(run) for run in saved] != [_identity(run) for run in results]:
        return ["the saved runs are not those of its table"], {}
    problems, whole = [], {}
    for shown, record in zip(results, saved, strict=True):
        shown_fields, record_fields = saved_fields(shown), saved_fields(record)
        if differing := [name for name in shown_fields if shown_fields[name] != record_fields.get(name)]:
            problems.append(
                f"the saved run of {shown.label} differs from its table's in {', '.join(differing)}: "
                "a figure was set on the run after the lab saved it"
            )
        else:
            whole[_identity(shown)] = record
    return problems, whole


def verdict_problems(
    expectations: ExpectationLog, results: Sequence[RunResult], saved: Sequence[RunResult]
) -> list[str]:
    """Each way a notebook's verdicts (`expectations`) disagree with its runs; none is a pass.
    `results` are the runs its table shows, `saved` the runs it saved to its file in this session.
    Every run of the table must be the one saved, equal in every field; each figure a verdict
    used must come from a run of its table and, read again from that run's saved record, give the
    same number; every condition NOT CHECKED must say why; and every expectation that must hold
    (`must_hold`) must have held."""
    problems, whole = _compare_saved(results, saved)
    if not expectations:
        problems.append("no expectation was recorded")
    tabled = {_identity(run) for run in results}
    from_runs = [item for item in expectations.figures() if item.run is not None]
    if not from_runs:
        problems.append("no verdict read a number from a run")
    for item in from_runs:
        key = (item.run, item.started_at)
        if key not in tabled:
            problems.append(f"a verdict used {item.name} of {item.run}, which is not in its table")
            continue
        if key not in whole:
            continue  # its saved run is not its table's: said above
        assert item.field is not None, "a figure read from a run names its field (see `figure`)"
        again = read(whole[key], item.field)
        same = (math.isnan(again) and math.isnan(item.value)) or math.isclose(
            again, item.value, rel_tol=1e-6, abs_tol=1e-12
        )
        if not same:
            problems.append(f"{item.name} is {item.value} in a verdict but {again} in its saved run")
    problems += [
        f"{expectation.claim!r}: {part.text!r} is NOT CHECKED without saying why (a check builds it with "
        "`not_checked` and the reason its premise did not arise)"
        for expectation in expectations
        for part in expectation.conditions
        if part.outcome is Outcome.NOT_CHECKED and not part.detail
    ]
    problems += [
        f"{expectation.claim!r} {expectation.outcome.value}, and it must hold: it is a claim about what the lab's "
        "software does, not about speed (its conditions, printed above, say which part failed)"
        for expectation in expectations
        if expectation.must_hold and expectation.outcome is not Outcome.HELD
    ]
    return problems
