"""What a student predicts before an experiment, and how it is said beside the verdict.

A prediction is a number where the check measures one (its `Estimate`: the speedup of 4 instances
over 1), whether the claim holds (True/False), or words; None where it was asked and left empty.
One typed in a form its check cannot judge (a number where it measures none, a list) is the
student's slip: a PredictionError that says which form to type, and the lab keeps nothing of it
(`checked_prediction`, before the expectation is recorded; servelab.lessons.expectations).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from enum import Enum


class NotAsked(Enum):
    """`predicted` where the lesson asked for no prediction (None: asked, and left empty)."""

    NOT_ASKED = "not asked"


NOT_ASKED = NotAsked.NOT_ASKED
Prediction = bool | float | str | None | NotAsked


@dataclass(frozen=True)
class Estimate:
    """The number a check lets the student predict (the speedup of 4 instances over 1), as this run
    measured it: computed from the check's own figures (NaN where they are missing)."""

    what: str
    value: float
    unit: str = ""  # "x" for a ratio, else a unit: "ms", "req/s"

    @classmethod
    def ratio(cls, what: str, over: float, under: float) -> Estimate:
        """`over` / `under`, a ratio ("x"); NaN where `under` is 0 (nothing to divide by) or not measured."""
        return cls(what, over / under if under else math.nan, "x")

    def shown(self, value: float) -> str:
        return f"x{value:.3g}" if self.unit == "x" else f"{value:.3g} {self.unit}".rstrip()


class AnswerError(ValueError):
    """Answers typed that a check cannot judge (a count typed twice): the message says what to change,
    and IPython shows it instead of a traceback."""

    def _render_traceback_(self) -> list[str]:
        return str(self).splitlines()


class PredictionError(AnswerError):
    """A prediction typed in a form its check cannot judge (a number where it measures none): the
    student's slip, not the lab's; the message says what to type."""


def refused_prediction(claim: str, predicted: object, estimate: Estimate | None) -> str:
    """What to say of `predicted`, typed in a form the check of `claim` cannot judge: the form it
    takes, then to run the cell again."""
    if estimate is None:
        form = (
            f"this check measures no number to compare {predicted!r} with: type True if you expect it to hold, "
            "False if not (or your expectation in words, in quotes)"
        )
    else:
        unit = " (a ratio, such as 1.5)" if estimate.unit == "x" else f", in {estimate.unit}" if estimate.unit else ""
        form = (
            f"{predicted!r} is not a number it can compare: type a number, {estimate.what}{unit}; or True if you "
            "expect it to hold, False if not"
        )
    return f"Your prediction for {claim!r} was not recorded: {form}. Then run this cell again."


def checked_prediction(claim: str, predicted: object, estimate: Estimate | None) -> Prediction:
    """`predicted` in a form the check of `claim` can judge (a number made a float); a
    PredictionError, saying which form to type, where it is not."""
    if predicted is None or predicted is NOT_ASKED or isinstance(predicted, bool | str):
        return predicted
    if isinstance(predicted, numbers.Real) and estimate is not None and math.isfinite(float(predicted)):
        return float(predicted)
    raise PredictionError(refused_prediction(claim, predicted, estimate))


def prediction_said(claim: str, predicted: Prediction, estimate: Estimate | None, held: bool | None) -> str:
    """The student's prediction beside the outcome of `claim` (`held`: None where it was not
    checked); empty where the lesson asked for none."""
    if predicted is NOT_ASKED:
        return ""
    if predicted is None:
        return "No prediction made."
    if isinstance(predicted, str):
        return f"Your prediction: {predicted}" if predicted.strip() else "Your prediction: (none written)"
    if not isinstance(predicted, bool):
        if estimate is None:
            raise PredictionError(refused_prediction(claim, predicted, None))
        said = f"You predicted {estimate.what}: {estimate.shown(predicted)}"
        measured = estimate.value
        if not math.isfinite(measured):
            return f"{said}; not measured here, so neither right nor wrong"
        off = f"off by {predicted / measured - 1:+.0%}" if measured else f"off by {predicted - measured:+.3g}"
        return f"{said}; measured {estimate.shown(measured)}: {off}"
    guess = "it would hold" if predicted else "it would not hold"
    if held is None:
        return f"You predicted {guess}: not checked here, so neither right nor wrong"
    return f"You predicted {guess}: {'right' if predicted == held else 'wrong'}"
