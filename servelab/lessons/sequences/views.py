"""What notebook 11 prints of a frame's answer (`describe`)."""

from __future__ import annotations

from typing import Any


def describe(answer: Any) -> str:
    """A frame's answer in one line: what the frame says and what the sequence says so far; or the
    error that refused it (tritonclient's InferenceServerException, its text through `message()`)."""
    if isinstance(answer, Exception):
        said = getattr(answer, "message", None)
        return f"ERROR {said() if callable(said) else answer}"
    label, probability = _text(answer["SEQUENCE_LABEL"]), answer["SEQUENCE_PROBABILITY"]
    return (
        f"frame says {_text(answer['FRAME_LABEL'])}; the sequence so far says {label} ({probability:.3f}) "
        f"after {answer['FRAMES_SEEN']} frame(s)"
    )


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
