"""Food-11: the model's eleven classes, and how a photo becomes its input.

What every service, Triton model and the web UI share about the *model* (no serving here): the
labels, decoding a photo (base64 or file bytes), preprocessing it into MobileNetV2's input, the
softmax and the top class; and the refinement's views, for the streams that classify a photo over
N steps. It needs only numpy and Pillow, so that a service without PyTorch (ONNX Runtime, the web
UI) imports it too. The lab installs it as a top-level module (pyproject.toml); each image copies it.
"""

from __future__ import annotations

import base64
import binascii
import io
import json
from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

LABELS: tuple[str, ...] = (
    "Bread",
    "Dairy product",
    "Dessert",
    "Egg",
    "Fried food",
    "Meat",
    "Noodles/Pasta",
    "Rice",
    "Seafood",
    "Soup",
    "Vegetable/Fruit",
)
IMAGE_SIZE = 224
IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
IMAGENET_STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)

# An upload larger than this many pixels is refused before it is decoded in full: a small,
# highly compressed file can otherwise expand into gigabytes of memory.
MAX_IMAGE_PIXELS = 40_000_000

# `make artifacts` writes a record beside every model file: trained or untrained weights, and whence.
WEIGHTS_INFO_SUFFIX = ".weights.json"


class InvalidImageError(ValueError):
    """The request carried something that is not a decodable image; the message says what to do."""


# An image in a request is canonical base64 (RFC 4648: padded, no line breaks); decode_base64 takes
# exactly that, and nothing else (anything else is a 400 saying so).
BASE64_PATTERN = r"^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"


def decode_base64(encoded: str | bytes) -> bytes:
    """The bytes of canonical base64 text (BASE64_PATTERN); InvalidImageError saying what to send otherwise."""
    try:
        raw = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raw = None
    # Python's strict decoder also takes '=' past a complete group ("AAAA=="): checked here, at the
    # cost of a length, rather than by matching BASE64_PATTERN, ten times slower than the decoding.
    padded = encoded.endswith("===") if isinstance(encoded, str) else encoded.endswith(b"===")
    if raw is None or len(encoded) % 4 or padded:
        raise InvalidImageError(
            "The 'image' field is not valid base64. Send the file's bytes base64-encoded, "
            "for example base64.b64encode(open('food.jpg', 'rb').read()).decode()."
        )
    return raw


def decode_base64_image(encoded: str | bytes) -> Image.Image:
    """Decode a base64 string holding a JPEG/PNG (or any format Pillow reads) into an RGB image."""
    return decode_image_bytes(decode_base64(encoded))


def decode_image_bytes(raw: bytes) -> Image.Image:
    """Decode image file bytes into an RGB image, refusing empty, unreadable or oversized images."""
    if not raw:
        raise InvalidImageError("The image is empty. Send the bytes of a JPEG or PNG file.")
    try:
        image = Image.open(io.BytesIO(raw))
        width, height = image.size
        if width * height > MAX_IMAGE_PIXELS:
            raise InvalidImageError(
                f"The image is {width}x{height} pixels, more than the {MAX_IMAGE_PIXELS} allowed. "
                "Resize it before sending; the model only sees 224x224 anyway."
            )
        image.load()  # decode now, so that a truncated file fails here as a bad image
        # Converting an image that is RGB already would copy it, at the cost of a second decode.
        return image if image.mode == "RGB" else image.convert("RGB")
    except InvalidImageError:
        raise
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError, Image.DecompressionBombError) as exc:
        raise InvalidImageError(
            f"The bytes are not an image Pillow can read ({type(exc).__name__}). Send a JPEG or PNG file."
        ) from exc


# Normalising is one multiply-add per channel: (x / 255 - mean) / std = x * SCALE + SHIFT.
_SCALE = (1.0 / (255.0 * IMAGENET_STD)).astype(np.float32)
_SHIFT = (-IMAGENET_MEAN / IMAGENET_STD).astype(np.float32)


def preprocess(image: Image.Image) -> np.ndarray:
    """RGB image -> float32 array [3, 224, 224]: resize, scale to [0, 1], ImageNet mean/std."""
    if image.mode != "RGB":
        image = image.convert("RGB")
    return normalize(np.asarray(image.resize((IMAGE_SIZE, IMAGE_SIZE), Image.Resampling.BILINEAR)))


def normalize(pixels: np.ndarray) -> np.ndarray:
    """uint8 pixels [224, 224, 3] (any strides: a crop, a mirrored view) -> float32 [3, 224, 224]."""
    # Channel by channel, straight into the [3, 224, 224] layout: a few times faster than
    # broadcasting over a trailing axis of 3, which costs as much as the resize itself.
    normalized = np.empty((3, IMAGE_SIZE, IMAGE_SIZE), dtype=np.float32)
    for channel in range(3):
        np.multiply(pixels[:, :, channel], _SCALE[channel], out=normalized[channel], casting="unsafe")
        normalized[channel] += _SHIFT[channel]
    return normalized


def softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise softmax of a [N, classes] array, stable for large logits."""
    shifted = logits - logits.max(axis=-1, keepdims=True)
    exp = np.exp(shifted)
    return exp / exp.sum(axis=-1, keepdims=True)


def top_prediction(logits: np.ndarray) -> list[tuple[str, float]]:
    """[N, 11] logits -> one (label, softmax probability) pair per row."""
    probabilities = softmax(np.asarray(logits, dtype=np.float64))
    best = probabilities.argmax(axis=-1)
    return [(LABELS[index], float(probabilities[row, index])) for row, index in enumerate(best)]


def read_weights_info(model_file: str | Path) -> dict:
    """The record that says whether a model file holds trained or untrained weights; a model file
    without one is reported as of unknown origin rather than guessed at."""
    info_path = Path(str(model_file) + WEIGHTS_INFO_SUFFIX)
    if not info_path.is_file():
        return {"weights": "unknown", "note": f"no {info_path.name} beside the model file"}
    return json.loads(info_path.read_text())


# ---- the refinement: a photo classified over N steps, one view each --------------------------
#
# Work that runs long and streams is where cancellation saves the most. The lab's stand-in for a
# generation: step k runs the model once more on one more view of the photo (test-time
# augmentation: the centre crop first, then crops at seeded offsets, every other one mirrored), and
# the answer after it is the running mean of the probabilities so far. Every step is one real
# forward pass, and a view depends on its step's number alone, so every server gives the same
# answers for the same photo and step count.

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
