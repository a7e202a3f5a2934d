"""The lab's streamed, iterative workload: a photo classified over N steps, each answer streamed.

Work that runs long and streams is where cancellation saves the most: a generation stopped midway
frees every step it had left. The lab's stand-in for a generation is a *refinement*. Step k runs
MobileNetV2 once more, on one more view of the photo (test-time augmentation: the centre crop
first, then crops at seeded offsets, every other one mirrored), and the answer after it is the
running mean of the softmax probabilities so far: its best class and that class's probability.
The answer settles as the steps go on, and a client watching it may leave as soon as it looks good
enough; every step computed after that is for nobody, unless the server stops.

Every step is one real forward pass: nothing sleeps in place of compute. A view is chosen by its
step's number alone, so every server gives the same answers for the same photo and step count.

Defined once here, for the FastAPI services and Ray Serve (refine_api.py: POST /refine, one NDJSON
line per step) and for the decoupled Triton model `food_refine` (one response per step, over gRPC
streaming). Needs only numpy and Pillow, as food11.py does.
"""

from __future__ import annotations

import numpy as np
from PIL import Image

from servelab.service.food11 import IMAGE_SIZE, LABELS, normalize, softmax

DEFAULT_STEPS = 16
MAX_STEPS = 64  # a bound on the work one request may ask for
VIEW_SOURCE = 256  # each photo is resized to this square once; every view is a 224x224 crop of it
_MARGIN = VIEW_SOURCE - IMAGE_SIZE


def checked_steps(steps: object) -> int:
    """`steps` as a number of steps; ValueError saying what to send when it is not one from 1 to MAX_STEPS."""
    if isinstance(steps, bool) or not isinstance(steps, int | np.integer) or not 1 <= steps <= MAX_STEPS:
        raise ValueError(
            f"steps must be a whole number from 1 to {MAX_STEPS} (one forward pass each), not {steps!r}; "
            f"leave it out for {DEFAULT_STEPS}."
        )
    return int(steps)


def view_geometry(step: int) -> tuple[int, int, bool]:
    """(top, left, mirrored) of view `step` (from 1) in the VIEW_SOURCE square: the centre first,
    then offsets drawn from a generator seeded by the step, every even step mirrored."""
    if step == 1:
        return _MARGIN // 2, _MARGIN // 2, False
    top, left = np.random.default_rng(step).integers(0, _MARGIN + 1, size=2)
    return int(top), int(left), step % 2 == 0


class Views:
    """The views of one or more photos (a client's batch), one batch of them per step."""

    def __init__(self, images: list[Image.Image]) -> None:
        size = (VIEW_SOURCE, VIEW_SOURCE)
        self.pixels = [np.asarray(image.convert("RGB").resize(size, Image.Resampling.BILINEAR)) for image in images]

    def batch(self, step: int) -> np.ndarray:
        """[photos, 3, 224, 224]: view `step` of every photo, normalised as the model expects."""
        top, left, mirrored = view_geometry(step)
        crops = [pixels[top : top + IMAGE_SIZE, left : left + IMAGE_SIZE] for pixels in self.pixels]
        return np.stack([normalize(crop[:, ::-1] if mirrored else crop) for crop in crops])


class RunningMean:
    """The running mean of the softmax probabilities of every step so far, per photo."""

    def __init__(self) -> None:
        self.total: np.ndarray | None = None
        self.steps = 0

    def add(self, logits: np.ndarray) -> list[tuple[str, float]]:
        """Add one step's logits [photos, 11]; the answer so far: (label, probability) per photo."""
        probabilities = softmax(np.asarray(logits, dtype=np.float64))
        self.total = probabilities if self.total is None else self.total + probabilities
        self.steps += 1
        mean = self.total / self.steps
        return [(LABELS[index], float(mean[row, index])) for row, index in enumerate(mean.argmax(axis=-1))]
