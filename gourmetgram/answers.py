"""What a backend answers GourmetGram's page (gourmetgram/backends.py): a `Prediction`, its
weights' status (`WeightsStatus`, for the banner every page shows), or why it could not:
BackendUnavailable (the page answers 503) or BackendFailed (502).
"""

from __future__ import annotations

from dataclasses import dataclass


class BackendUnavailable(Exception):
    """The backend could not be reached, or did not answer in time: the page answers 503."""


class BackendFailed(Exception):
    """The backend answered, but with an error, a malformed reply, or a model it cannot call: 502."""


@dataclass(frozen=True)
class Prediction:
    label: str
    probability: float


@dataclass(frozen=True)
class WeightsStatus:
    """What the backend says about its weights: "trained", "untrained" or "unknown"."""

    weights: str
    note: str
    reachable: bool

    @property
    def banner(self) -> str | None:
        """The warning every page shows, or None when the weights are known to be trained."""
        if self.weights == "trained":
            return None
        if self.weights == "untrained":
            # The backend's own note says what the weights are and how to serve trained ones; said once.
            return self.note or "Untrained weights: the model was never trained, so its predictions are not meaningful."
        if not self.reachable:
            return (
                "Weights status unknown (backend unreachable): if the model is running untrained "
                "weights, its predictions are not meaningful."
            )
        return (
            "Weights status unknown: the backend does not know, or did not say, whether its weights are trained; "
            f"if they are not, its predictions are not meaningful. {self.note}"
        ).strip()
