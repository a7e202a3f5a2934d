"""Sequences: a stateful model's load, frame after frame, as cameras filming meals would send it.

A stateful Triton model (`sequence_batching`) keeps state per sequence between requests. Each
request carries one frame and its sequence's correlation ID; the first frame carries START, the
last END. `run_sequences` keeps its `SequenceLoad`'s `concurrency` sequences live at once, each `length` frames long,
and starts a new sequence in a slot when the previous one ends, until `sequences` have started or
`duration_s` has passed (a sequence under way then runs to its end).

Each sequence has at most one frame in flight: its next frame is sent when the previous one is
answered, which also keeps its frames in order on the way to Triton. With `frame_interval_s` the
frames come due at a fixed rate, like a camera's. A frame that comes due while the previous one is
still in flight is skipped and counted, never queued: this is the lab's client-side bound on the
work waiting per sequence (TorchServe's `maxSequenceJobQueueSize`), which Triton's sequence batcher
does not have. The last frame carries END, so it is never skipped: it goes out as soon as it can.

A frame that fails breaks its sequence: the sequence stops there and is counted as failed under
the frame's error kind. Triton's refusals are classified by the reason they give
(`SEQUENCE_ERRORS`); a failure to get any answer keeps its transport kind ("timeout",
"connection", "grpc_UNAVAILABLE").
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import math
import random
import re
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from servelab.loadgen.endpoint import DEFAULT_TIMEOUT_S, Endpoint
from servelab.loadgen.http import HttpError, PreparedPost
from servelab.loadgen.load import SequenceLoad
from servelab.loadgen.runners import Recorder, interrupted_note
from servelab.loadgen.targets import (
    RequestError,
    binary_inference_parts,
    grpc_error_kind,
    grpc_tensors,
    host_port_of,
)
from servelab.results import SEQUENCES, LatencySummary, SequenceRunResult

if TYPE_CHECKING:  # the registry reads configs with tritonclient: imported where a model is looked up
    from servelab.triton.models import ModelRequest

log = logging.getLogger(__name__)

SEQUENCE_TARGET_KINDS = ("triton-http", "triton-grpc")

# How a refused frame is counted: the reason the stateful model names at the start of its error
# message (models_staging/food_sequence), or Triton's own refusal of a frame without START for a
# sequence it does not know; "other" for any other refusal.
SEQUENCE_ERRORS = ("evicted", "expired", "timed_out", "cancelled", "ended", "not_started", "other")
_REASON = re.compile(r"\b(evicted|expired|timed out|cancell?ed|ended)\b", re.IGNORECASE)
_NOT_STARTED = "must specify the START flag"

# Correlation IDs, distinct across every run of this process: a later run never reuses the ID of a
# sequence the server may still hold. The random base keeps two processes (or perf_analyzer, which
# counts from 1) from colliding; it stays far below 2**63, the largest ID Triton takes.
_correlation_ids = itertools.count(random.randrange(1 << 20, 1 << 40))


def sequence_error_kind(message: str) -> str:
    """The `SEQUENCE_ERRORS` kind of an error message from Triton or the stateful model."""
    if _NOT_STARTED in message:
        return "not_started"
    reason = _REASON.search(message)
    if reason is None:
        return "other"
    word = reason.group(1).lower()
    return "cancelled" if word.startswith("cancel") else word.replace(" ", "_")


class SequenceTarget(ABC):
    """A stateful model's endpoint with one prepared frame, sent for any sequence."""

    name: str

    @abstractmethod
    async def open(self) -> None:
        """Connect."""

    @abstractmethod
    async def send_frame(self, sequence_id: int, start: bool, end: bool) -> None:
        """Send one frame of sequence `sequence_id` and wait for the answer; raise `RequestError`
        (kind: one of `SEQUENCE_ERRORS`, or a transport failure) if it failed."""

    @abstractmethod
    async def close(self) -> None:
        """Release the connections."""


class TritonHttpSequenceTarget(SequenceTarget):
    """KServe v2 over HTTP with binary tensors (as `TritonHttpTarget`), and the sequence's
    `sequence_id`, `sequence_start` and `sequence_end` as request parameters. Only those change
    from frame to frame: the rest of the JSON header and the tensor bytes are built once."""

    def __init__(
        self, host_port: str, model: str, request: ModelRequest, timeout_s: float = DEFAULT_TIMEOUT_S, name: str = ""
    ) -> None:
        self.name = name or f"triton/{model} (http)"
        tensors, self._raw = binary_inference_parts(request)
        self._tensors_json = json.dumps(tensors).encode()[1:]  # without its "{": parameters go first
        # Only its connections are used: each frame's bytes are built by `build` when it is sent.
        self._post = PreparedPost(f"http://{host_port_of(host_port)}/v2/models/{model}/infer", b"", {}, timeout_s)

    async def open(self) -> None:
        """Connections are opened as sequences need them, and kept for the next frame."""

    async def send_frame(self, sequence_id: int, start: bool, end: bool) -> None:
        parameters = b'{"parameters":{"sequence_id":%d,"sequence_start":%s,"sequence_end":%s},' % (
            sequence_id,
            b"true" if start else b"false",
            b"true" if end else b"false",
        )
        header = parameters + self._tensors_json
        headers = {"Inference-Header-Content-Length": str(len(header)), "Content-Type": "application/octet-stream"}
        try:
            status, answer = await self._post.send(self._post.build(headers, header, self._raw))
        except HttpError as exc:
            raise RequestError(exc.kind, str(exc)) from exc
        if status != 200:
            message = answer[:300].decode(errors="replace")
            raise RequestError(sequence_error_kind(message), f"HTTP {status}: {message}")

    async def close(self) -> None:
        self._post.close()


class TritonGrpcSequenceTarget(SequenceTarget):
    """KServe v2 over gRPC (tritonclient's asyncio client, one channel), with the sequence's ID
    and flags in each request."""

    def __init__(
        self, host_port: str, model: str, request: ModelRequest, timeout_s: float = DEFAULT_TIMEOUT_S, name: str = ""
    ) -> None:
        self.name = name or f"triton/{model} (grpc)"
        self.host_port, self.model, self.timeout_s = host_port_of(host_port), model, timeout_s
        self.inputs, self.outputs = grpc_tensors(request)
        self._client: Any = None  # tritonclient's asyncio InferenceServerClient, once open

    async def open(self) -> None:
        import tritonclient.grpc.aio as grpcclient_aio  # where it is used: an HTTP load runs without it

        self._client = grpcclient_aio.InferenceServerClient(self.host_port)

    async def send_frame(self, sequence_id: int, start: bool, end: bool) -> None:
        from tritonclient.utils import InferenceServerException

        assert self._client is not None, "open() before sending"
        try:
            await self._client.infer(
                self.model,
                self.inputs,
                outputs=self.outputs,
                sequence_id=sequence_id,
                sequence_start=start,
                sequence_end=end,
                client_timeout=self.timeout_s,
            )
        except InferenceServerException as exc:
            kind = grpc_error_kind(exc)
            if kind not in ("timeout", "grpc_UNAVAILABLE"):  # Triton answered: it says why
                kind = "cancelled" if kind == "grpc_CANCELLED" else sequence_error_kind(exc.message() or "")
            raise RequestError(kind, exc.message() or "") from exc

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None


def make_sequence_target(endpoint: Endpoint) -> SequenceTarget:
    """The target that sends frames to `endpoint`: a stateful Triton model over "triton-http" or
    "triton-grpc", whose frame is built from the endpoint's image."""
    if endpoint.kind not in SEQUENCE_TARGET_KINDS:
        raise ValueError(
            f"sequences go to Triton: kind is one of {', '.join(SEQUENCE_TARGET_KINDS)}, not {endpoint.kind!r}"
        )
    from servelab.triton.models import ModelError

    model = endpoint.triton_model
    registered = endpoint.registry.get(model)
    if not registered.stateful:
        raise ModelError(
            f"{model} is not stateful (no sequence_batching in its config): measure it with closed_loop or open_loop"
        )
    target_class = TritonHttpSequenceTarget if endpoint.kind == "triton-http" else TritonGrpcSequenceTarget
    return target_class(endpoint.address, model, registered.request(endpoint.image), endpoint.timeout_s)


class SequenceRecorder(Recorder):
    """A phase's frames (as `Recorder` counts requests), and what became of its sequences."""

    def __init__(self, description: str, total_frames: int | None, progress: bool, watch_loop: bool = False) -> None:
        super().__init__(description, total_frames, progress, unit="frame", watch_loop=watch_loop)
        self.sequences = 0
        self.sequence_latencies_ms: list[float] = []
        self.sequences_failed: dict[str, int] = {}
        self.frames_skipped = 0


async def _one_sequence(
    target: SequenceTarget, length: int, frame_interval_s: float | None, recorder: SequenceRecorder
) -> None:
    sequence_id = next(_correlation_ids)
    recorder.sequences += 1
    first_sent = time.perf_counter()
    frame = 0
    while frame < length:
        if frame_interval_s:
            await asyncio.sleep(max(first_sent + frame * frame_interval_s - time.perf_counter(), 0.0))
        sent = time.perf_counter()
        try:
            await target.send_frame(sequence_id, start=frame == 0, end=frame == length - 1)
        except RequestError as error:
            recorder.failure(error, time.perf_counter() - sent)
            recorder.sequences_failed[error.kind] = recorder.sequences_failed.get(error.kind, 0) + 1
            return
        answered = time.perf_counter()
        recorder.success(answered - sent)
        frame += 1
        if frame_interval_s and frame < length:
            # The frames that came due while this one was in flight are skipped; the last is sent anyway.
            due_next = math.ceil((answered - first_sent) / frame_interval_s)
            next_frame = max(frame, min(due_next, length - 1))
            recorder.frames_skipped += next_frame - frame
            frame = next_frame
    recorder.sequence_latencies_ms.append((time.perf_counter() - first_sent) * 1000.0)


async def _sequence_phase(target: SequenceTarget, load: SequenceLoad, recorder: SequenceRecorder) -> None:
    limit = load.sequences_to_start or math.inf
    deadline = math.inf if load.duration_s is None else recorder.started + load.duration_s
    interval_s = load.frame_interval_s

    async def slot(index: int) -> None:
        if interval_s:  # cameras are not synchronised: their frames are spread over the interval
            await asyncio.sleep(index * interval_s / load.concurrency)
        while recorder.sequences < limit and time.perf_counter() < deadline:
            await _one_sequence(target, load.length, interval_s, recorder)

    try:
        await asyncio.gather(*(slot(index) for index in range(load.concurrency)))
    finally:
        recorder.finish()


async def run_sequences(
    target: SequenceTarget, load: SequenceLoad, progress: bool = True, on_measuring: Callable[[], None] | None = None
) -> SequenceRunResult:
    """`load.concurrency` sequences live at once, each of `load.length` frames, until
    `load.sequences` have started or `load.duration_s` has passed (see SequenceLoad). With
    `load.frame_interval_s`, a frame due while the previous one is in flight is skipped
    (`frames_skipped`), and the sequences start spread over one interval. `load.warmup_sequences`
    run first, at the same concurrency, unmeasured; `on_measuring()` is called after them, as
    measurement starts (see run_closed). Cancelling the run (Ctrl-C) returns what was
    measured until then, with a note saying so.
    """
    pace = f"a frame every {load.frame_interval_s * 1000:g} ms" if load.frame_interval_s else "frames back to back"
    log.info("%d sequences of %d frames at once against %s, %s", load.concurrency, load.length, target.name, pace)
    description = f"{load.concurrency} sequences x {load.length}"
    notes: list[str] = []
    recorder: SequenceRecorder | None = None
    await target.open()
    try:
        if load.warmup_sequences:
            warmup = SequenceRecorder("warm-up", load.warmup_sequences * load.length, progress)
            await _sequence_phase(target, load.warmup(), warmup)
        if on_measuring:
            on_measuring()  # as in run_closed: no frame is in flight between the phases
        to_start = load.sequences_to_start
        total_frames = to_start * load.length if to_start is not None else None
        recorder = SequenceRecorder(description, total_frames, progress, watch_loop=True)
        await _sequence_phase(target, load, recorder)
    except asyncio.CancelledError:
        # As in run_closed: stopping early keeps what was measured.
        recorder = recorder or SequenceRecorder(description, None, progress=False)
        recorder.finish()
        notes.append(interrupted_note(recorder))
        log.warning("%s", notes[-1])
    finally:
        await target.close()
    return _result(target, load, recorder, notes)


def _result(
    target: SequenceTarget, load: SequenceLoad, recorder: SequenceRecorder, notes: list[str]
) -> SequenceRunResult:
    wall_s = recorder.wall_s
    return SequenceRunResult(
        name=target.name,
        tool="loadgen",
        mode=SEQUENCES,
        requests=recorder.count,
        throughput_rps=len(recorder.latencies_ms) / wall_s if wall_s > 0 else 0.0,
        latency=LatencySummary.of(recorder.latencies_ms),
        wall_s=wall_s,
        concurrency=load.concurrency,
        errors=dict(recorder.errors),
        latencies_ms=recorder.latencies_ms,
        timeline=recorder.timeline,
        notes=notes,
        sequence_length=load.length,
        frame_interval_s=load.frame_interval_s,
        sequences=recorder.sequences,
        sequences_completed=len(recorder.sequence_latencies_ms),
        sequences_failed=recorder.sequences_failed,
        frames_skipped=recorder.frames_skipped,
        sequence_latency=LatencySummary.of(recorder.sequence_latencies_ms),
        sequence_latencies_ms=recorder.sequence_latencies_ms,
        schedule_lag=recorder.schedule_lag,
    )
