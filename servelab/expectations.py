"""The lesson checks: what a lesson expects to see, and whether this run's numbers bore it out.

Each notebook states an expectation in prose before it measures ("queueing grows with
concurrency"), then records it with the numbers it was judged on. An expectation that could not
be judged, because a measurement gave no number, is recorded as such: it appears in the
notebook's final list as NOT CHECKED, never silently dropped and never counted as held.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Outcome(Enum):
    HELD = "HELD"
    NOT_HELD = "DID NOT HOLD"
    NOT_CHECKED = "NOT CHECKED"


@dataclass(frozen=True)
class Expectation:
    claim: str
    outcome: Outcome
    evidence: str  # the numbers it was judged on, or why there were none
    reason: str = ""  # why it may not hold here; shown only when it did not

    def __str__(self) -> str:
        where = "" if self.outcome is Outcome.NOT_CHECKED else " on this machine"
        text = f"Expectation: {self.claim}\n  -> {self.outcome.value}{where}: {self.evidence}"
        if self.reason and self.outcome is Outcome.NOT_HELD:
            text += f"\n  Why: {self.reason}"
        return text


class ExpectationLog(list):
    """Every expectation a notebook recorded, in order."""

    def judge(self, claim: str, held: bool, evidence: str, reason: str = "") -> Expectation:
        """Record `claim` as held or not, with the evidence (the numbers) it was judged on."""
        return self._add(Expectation(claim, Outcome.HELD if held else Outcome.NOT_HELD, evidence, reason))

    def not_checked(self, claim: str, why: str) -> Expectation:
        """Record that `claim` could not be judged on this run, and why."""
        return self._add(Expectation(claim, Outcome.NOT_CHECKED, why))

    def _add(self, expectation: Expectation) -> Expectation:
        self.append(expectation)
        print(expectation)
        return expectation

    def summary(self) -> str:
        """One line per expectation: the verdict list at the end of a notebook."""
        width = max((len(outcome.value) for outcome in Outcome), default=0)
        return "\n".join(f"{item.outcome.value:>{width}}: {item.claim}" for item in self)
