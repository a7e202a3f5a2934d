"""Streams: requests answered step by step, and clients who leave before the last step.

A streamed request (the refinement of food11.py: POST /refine on the FastAPI
services and Ray Serve, one NDJSON line per step; the decoupled Triton model `food_refine` over
gRPC streaming, one response per step) answers with one message per step. `run_streams` is a
closed loop of streams: `concurrency` senders, each opening its next stream as soon as the last
one ended. `impatient` of them leave early, as a user who has seen enough does: after
`leave_after_steps` steps, or after `patience_s` seconds, whichever comes first. Leaving is what
their protocol does: closing the HTTP connection, cancelling the gRPC call. The sender then waits
`backoff_s` and opens a new stream, as a new client.

A stream is answered (a success) when it got every step; its latency is the time to its last
step, and the patient senders' answers are the run's `patient_latency`. A stream its client left
is `cancelled`. The run's `steps` record the steps each stream received. What the server computed
for the clients who left is only the server's to say: whoever runs the loop reads it from the
server's own counters around the run (servelab.lab.measuring.Measurer.streams).
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import math
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from servelab.loadgen.endpoint import Endpoint
from servelab.loadgen.http import chunks, framing
from servelab.loadgen.load import Load
from servelab.loadgen.runners import Recorder, interrupted_note, run_result
from servelab.loadgen.targets import RequestError, grpc_tensors, host_port_of, model_request
from servelab.results import RunResult

if TYPE_CHECKING:
    from servelab.triton.models import ModelRepository

log = logging.getLogger(__name__)

STREAM_TARGET_KINDS = ("fastapi", "triton-grpc")  # fastapi: any service with POST /refine (Ray Serve too)


class StreamTarget(ABC):
    """An endpoint that answers one request with a stream of steps. `open` before, `close` after."""

    name: str
    timeout_s: float  # the longest a stream may take

    @abstractmethod
    async def open(self) -> None:
        """Connect, where the protocol keeps one connection for every stream."""

    @abstractmethod
    def stream(self, steps: int) -> AsyncGenerator[dict[str, Any], None]:
        """Ask for `steps` steps; yield each as it arrives ({"step", "prediction", "probability"}).
        Closing the iterator before its end is leaving: the request is cancelled as the protocol
        does it. Raises RequestError when the request fails."""

    @abstractmethod
    async def close(self) -> None:
        """Release the connections."""


class HttpStreamTarget(StreamTarget):
    """POST {base_url}/refine with {"image": <base64>, "steps": N}: one NDJSON line per step, each
    stream on a connection of its own, which leaving closes."""

    def __init__(self, base_url: str, image_bytes: bytes, timeout_s: float, name: str | None = None) -> None:
        parts = urlsplit(f"{base_url.rstrip('/')}/refine")
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"{base_url}: the load generator sends plain http:// requests to a host")
        self.name = name or f"refine ({base_url})"
        self.host, self.port, self.path, self.netloc = parts.hostname, parts.port or 80, parts.path, parts.netloc
        self.image = base64.b64encode(image_bytes).decode()
        self.timeout_s = timeout_s

    async def open(self) -> None:
        """Each stream opens a connection of its own."""

    async def close(self) -> None:
        """Each stream closes its own connection."""

    def _request(self, steps: int) -> bytes:
        body = json.dumps({"image": self.image, "steps": steps}).encode()
        head = (
            f"POST {self.path} HTTP/1.1\r\nHost: {self.netloc}\r\nContent-Type: application/json\r\n"
            f"Connection: close\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        return head.encode() + body

    async def stream(self, steps: int) -> AsyncGenerator[dict[str, Any], None]:
        try:
            reader, writer = await asyncio.open_connection(self.host, self.port, limit=1 << 20)
        except OSError as exc:
            raise RequestError("connection", f"{type(exc).__name__}: {exc}") from exc
        try:
            writer.write(self._request(steps))
            await writer.drain()
            head = await reader.readuntil(b"\r\n\r\n")
            status = int(head[9:12])
            length, chunked, _ = framing(head)
            if status != 200:
                body = await (reader.readexactly(length) if length is not None else reader.read())
                raise RequestError(f"http_{status}", body[:300].decode(errors="replace"))
            if not chunked:
                raise RequestError("not_streamed", "the answer to /refine was not a chunked stream")
            pending = b""
            async for chunk in chunks(reader):
                *lines, pending = (pending + chunk).split(b"\n")
                for line in filter(None, lines):
                    step = json.loads(line)
                    if "error" in step:
                        raise RequestError("stream_error", str(step["error"]))
                    yield step
        except (OSError, asyncio.IncompleteReadError, ValueError) as exc:  # reset, cut short, garbled
            raise RequestError("connection", f"{type(exc).__name__}: {exc}") from exc
        finally:
            writer.close()  # after the last step, or to leave: the server sees the connection close


class TritonGrpcStreamTarget(StreamTarget):
    """A decoupled Triton model (food_refine) over gRPC streaming: one request on its own stream,
    with the request parameter `steps`, one response per step. Leaving cancels the call."""

    def __init__(
        self,
        host_port: str,
        model: str,
        image_bytes: bytes,
        timeout_s: float,
        name: str | None = None,
        models: ModelRepository | None = None,
    ) -> None:
        self.name = name or f"triton/{model} (grpc stream)"
        self.host_port, self.model, self.timeout_s = host_port_of(host_port), model, timeout_s
        self.inputs, self.outputs = grpc_tensors(model_request(model, image_bytes, models))
        self._client: Any = None  # tritonclient's asyncio InferenceServerClient, once open

    async def open(self) -> None:
        import tritonclient.grpc.aio as grpcclient_aio  # where it is used: an HTTP stream runs without it

        # gRPC multiplexes every stream over the channel's one HTTP/2 connection.
        self._client = grpcclient_aio.InferenceServerClient(self.host_port)

    async def stream(self, steps: int) -> AsyncGenerator[dict[str, Any], None]:
        import grpc
        from tritonclient.utils import InferenceServerException

        async def one_request():
            yield {
                "model_name": self.model,
                "inputs": self.inputs,
                "outputs": self.outputs,
                "parameters": {"steps": steps},
            }

        # The request side ends after its one request; the server ends the stream after the last step.
        assert self._client is not None, "open() before streaming"
        call = self._client.stream_infer(one_request())
        received = 0
        try:
            async for result, error in call:
                if error is not None:
                    raise RequestError("triton_error", error.message())
                received += 1
                yield {
                    "step": int(result.as_numpy("STEP")[0, 0]),
                    "prediction": result.as_numpy("FOOD_LABEL")[0, 0].decode(),
                    "probability": float(result.as_numpy("PROBABILITY")[0, 0]),
                }
        except grpc.RpcError as exc:  # the call failed as a whole: the server went away, say
            raise RequestError(f"grpc_{exc.code().name}", exc.details() or "") from exc
        except InferenceServerException as exc:
            raise RequestError("triton_error", exc.message() or "") from exc
        finally:
            # Leaving (or failing) before the last step cancels the call; a stream that got every
            # step is left to end by itself: a cancel racing its end is what crashes Triton 2.51.
            if received < steps:
                call.cancel()

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None
            # A cancelled call's status arrives in a task of gRPC's own: let it end before the
            # loop does, or asyncio reports it destroyed while pending.
            await asyncio.sleep(0)


def make_stream_target(endpoint: Endpoint) -> StreamTarget:
    """The target that streams from `endpoint`: "fastapi" (the base URL of a service with POST
    /refine: the FastAPI services, Ray Serve) or "triton-grpc" (a decoupled model such as food_refine)."""
    if endpoint.kind not in STREAM_TARGET_KINDS:
        raise ValueError(f"streams go to {' or '.join(STREAM_TARGET_KINDS)} targets, not {endpoint.kind!r}")
    if endpoint.image_url:
        raise ValueError("a stream's request sends the photo itself: image_url is for closed and open loops")
    if endpoint.kind == "fastapi":
        return HttpStreamTarget(endpoint.address, endpoint.image, endpoint.timeout_s)
    return TritonGrpcStreamTarget(
        endpoint.address, endpoint.triton_model, endpoint.image, endpoint.timeout_s, models=endpoint.models
    )


async def _one_stream(
    target: StreamTarget, steps: int, leave_after: int | None, deadline_s: float
) -> tuple[int, float, bool]:
    """One stream: (steps received, seconds to the last of them, left early). Leaves after
    `leave_after` steps (None: never) and, once `deadline_s` has passed, wherever it is."""
    received, last_s, started = 0, math.nan, time.perf_counter()
    stream = target.stream(steps)
    try:
        async with asyncio.timeout(deadline_s):
            async for _ in stream:
                received, last_s = received + 1, time.perf_counter() - started
                if received == leave_after:
                    return received, last_s, True
    except TimeoutError:
        return received, time.perf_counter() - started, True
    finally:
        await stream.aclose()  # leaving: the connection closes, the call is cancelled
    return received, last_s, False


async def run_streams(
    target: StreamTarget, load: Load, steps: int, leave_after_steps: int | None = None, progress: bool = True
) -> RunResult:
    """`load.concurrency` senders streaming `steps` steps each, for `load.duration_s` seconds (the
    streams under way then are followed to their end). `load.impatient` of them leave after
    `leave_after_steps` steps or `load.patience_s` seconds, whichever comes first, and wait
    `load.backoff_s` before the next stream. Every stream is bounded by the target's timeout.
    Ctrl-C returns what was measured."""
    concurrency, duration_s, impatient = load.concurrency, load.duration_s, load.impatient
    patience_s, backoff_s = load.patience_s, load.backoff_s
    if steps < 1 or duration_s is None:
        raise ValueError("steps must be at least 1, and streams run for a duration_s")
    if load.requests is not None or load.warms_up:
        raise ValueError("streams run for duration_s, without warm-up: requests and warm-up are for closed_loop")
    if impatient and leave_after_steps is None and patience_s is None:
        raise ValueError("impatient senders leave after leave_after_steps steps or patience_s seconds: give one")
    if leave_after_steps is not None and not 1 <= leave_after_steps < steps:
        raise ValueError(f"leave_after_steps must be from 1 to steps - 1 ({steps - 1})")
    log.info("streams against %s: %d senders, %d steps each, %g s", target.name, concurrency, steps, duration_s)
    recorder = Recorder(f"c={concurrency}, {steps} steps", None, progress, unit="stream", watch_loop=True)
    received_per_stream: list[int] = []
    notes = [f"each stream asked for {steps} steps"]
    if impatient:
        leaving = " or ".join(
            ([f"after {leave_after_steps} steps"] if leave_after_steps else [])
            + ([f"after {patience_s:g} s"] if patience_s else [])
        )
        notes.append(
            f"{impatient} of the {concurrency} senders left each stream {leaving}, and opened the next as a new "
            f"client{f' {backoff_s:g} s later' if backoff_s else ''}"
        )
    deadline = recorder.started + duration_s

    async def sender(leaves: bool) -> None:
        while time.perf_counter() < deadline:
            patience = min(patience_s or math.inf, target.timeout_s) if leaves else target.timeout_s
            since = time.perf_counter()
            try:
                received, elapsed_s, left = await _one_stream(
                    target, steps, leave_after_steps if leaves else None, patience
                )
            except RequestError as error:
                recorder.failure(error, time.perf_counter() - since)
                received_per_stream.append(0)
                await asyncio.sleep(backoff_s)
                continue
            received_per_stream.append(received)
            if received == steps:
                recorder.success(elapsed_s, patient=not leaves)
            elif left and leaves:
                recorder.gave_up(elapsed_s)
                await asyncio.sleep(backoff_s)
            else:
                recorder.failure(
                    RequestError("timeout", f"{received} of {steps} steps in {elapsed_s:.1f} s"), elapsed_s
                )

    await target.open()
    try:
        await asyncio.gather(*(sender(leaves) for leaves in [False] * (concurrency - impatient) + [True] * impatient))
    except asyncio.CancelledError:  # Ctrl-C: what was measured is the result, as in run_closed
        notes.append(interrupted_note(recorder))
        log.warning("%s", notes[-1])
    finally:
        recorder.finish()
        await target.close()
    result = run_result(target.name, "closed", recorder, notes, concurrency=concurrency, impatient=impatient)
    result.steps = {
        "asked": steps,
        "leave_after_steps": leave_after_steps,
        "patience_s": patience_s,
        "received": received_per_stream,
    }
    return result
