"""How GourmetGram's page calls a Triton model it knows by its shapes only: `recognise_model` reads
the model's metadata (GET /v2/models/{model}) and returns the call that fits one of two request
shapes (see gourmetgram/backends.py): an image file, base64-encoded (`ImageFileCall`), or a
preprocessed tensor (`TensorCall`), each turning Triton's result into a `Prediction`.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import tritonclient.http as triton_http
from answers import BackendFailed, Prediction
from PIL import Image

import food11

IMAGE_FILE = "image file (base64)"
PREPROCESSED_TENSOR = "preprocessed tensor"
# -1 is Triton's batch dimension: both shapes are those of a model with max_batch_size > 0.
IMAGE_FILE_SHAPE = [-1, 1]
TENSOR_SHAPE = [-1, 3, food11.IMAGE_SIZE, food11.IMAGE_SIZE]
LOGITS_SHAPE = [-1, len(food11.LABELS)]
KNOWN_SHAPES = (
    f"one BYTES input of shape {IMAGE_FILE_SHAPE} (an image file, base64-encoded) with a BYTES label output "
    f"and an FP32 probability output, each of shape {IMAGE_FILE_SHAPE}; or one FP32 input of shape {TENSOR_SHAPE} "
    f"(a preprocessed image) with one FP32 output of shape {LOGITS_SHAPE} (logits for the Food-11 classes)"
)


@dataclass(frozen=True)
class ImageFileCall:
    """Send the file itself, base64-encoded; the model decodes, preprocesses and labels it."""

    takes: ClassVar[str] = IMAGE_FILE
    input_name: str
    label_output: str
    probability_output: str

    @property
    def outputs(self) -> list[str]:
        return [self.label_output, self.probability_output]

    def inputs(self, raw: bytes, image: Image.Image) -> list[Any]:
        encoded = triton_http.InferInput(self.input_name, [1, 1], "BYTES")
        encoded.set_data_from_numpy(np.array([[base64.b64encode(raw).decode()]], dtype=object))
        return [encoded]

    def prediction(self, result: Any, model: str) -> Prediction:
        label, probability = result.as_numpy(self.label_output), result.as_numpy(self.probability_output)
        if label is None or probability is None or label.size != 1 or probability.size != 1:
            raise BackendFailed(
                f"model '{model}' did not return one {self.label_output} and one {self.probability_output}."
            )
        value = label.reshape(-1)[0]
        return Prediction(
            label=value.decode() if isinstance(value, bytes) else str(value),
            probability=float(probability.reshape(-1)[0]),
        )


@dataclass(frozen=True)
class TensorCall:
    """Send a preprocessed float tensor; the model is the bare network, so softmax happens here."""

    takes: ClassVar[str] = PREPROCESSED_TENSOR
    input_name: str
    logits_output: str

    @property
    def outputs(self) -> list[str]:
        return [self.logits_output]

    def inputs(self, raw: bytes, image: Image.Image) -> list[Any]:
        batch = food11.preprocess(image)[np.newaxis]  # [1, 3, 224, 224] float32
        tensor = triton_http.InferInput(self.input_name, list(batch.shape), "FP32")
        tensor.set_data_from_numpy(batch)
        return [tensor]

    def prediction(self, result: Any, model: str) -> Prediction:
        logits = result.as_numpy(self.logits_output)
        if logits is None or logits.shape != (1, len(food11.LABELS)):
            shape = None if logits is None else list(logits.shape)
            raise BackendFailed(
                f"model '{model}' returned {self.logits_output} of shape {shape}, not [1, {len(food11.LABELS)}]."
            )
        label, probability = food11.top_prediction(logits)[0]
        return Prediction(label=label, probability=probability)


ModelCall = ImageFileCall | TensorCall


def _describe(tensors: list[Mapping[str, Any]]) -> str:
    """Inputs or outputs as a message shows them: 'INPUT_IMAGE (BYTES [-1, 1]), ...'."""
    return ", ".join(f"{t.get('name')} ({t.get('datatype')} {t.get('shape')})" for t in tensors) or "none"


def recognise_model(metadata: Mapping[str, Any]) -> ModelCall:
    """How to call a Triton model, from its metadata (GET /v2/models/{model}); BackendFailed if neither shape fits.

    The match is on datatypes and shapes, never on names: those are what the page's request
    depends on, while tensor names are the model author's choice. Extra outputs are ignored, but
    the ones the page reads must be unambiguous (exactly one candidate each).
    """
    model = metadata.get("name", "?")
    inputs: list[Mapping[str, Any]] = list(metadata.get("inputs") or [])
    outputs: list[Mapping[str, Any]] = list(metadata.get("outputs") or [])

    def outputs_of(datatype: str, shape: list[int]) -> list[str]:
        return [o["name"] for o in outputs if o.get("datatype") == datatype and list(o.get("shape") or []) == shape]

    if len(inputs) == 1:
        (only,) = inputs
        datatype, shape = only.get("datatype"), list(only.get("shape") or [])
        if datatype == "BYTES" and shape == IMAGE_FILE_SHAPE:
            labels, probabilities = outputs_of("BYTES", IMAGE_FILE_SHAPE), outputs_of("FP32", IMAGE_FILE_SHAPE)
            if len(labels) == 1 and len(probabilities) == 1:
                return ImageFileCall(only["name"], label_output=labels[0], probability_output=probabilities[0])
        if datatype == "FP32" and shape == TENSOR_SHAPE:
            logits = outputs_of("FP32", LOGITS_SHAPE)
            if len(logits) == 1:
                return TensorCall(only["name"], logits_output=logits[0])
    raise BackendFailed(
        f"model '{model}' takes inputs {_describe(inputs)} and returns {_describe(outputs)}; "
        f"this page can call only two kinds of model: {KNOWN_SHAPES}."
    )
