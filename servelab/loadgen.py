"""The lab's load generator: closed loop (N users) and open loop (a request rate), in asyncio.

Two ways to load a server, and they answer different questions:

- Closed loop (`run_closed`): N concurrent senders, each sending its next request as soon as
  the previous one is answered. It measures what the server does at a fixed number of requests
  in flight. When the server slows down, the senders slow down with it, so the offered load
  adapts to the server.
- Open loop (`run_open`): requests arrive on a schedule (a constant rate, or a Poisson process
  like independent users), whether or not earlier ones were answered. This is how real traffic
  behaves. Latency is measured from each request's *scheduled* time, not from when the
  generator got round to sending it. Measuring from the send time instead would hide the wait
  of every request queued behind a stall ("coordinated omission").

Every request sends the same image, prepared once per target: the request body (or gRPC
tensors) is built up front and reused, connections are reused, and only the response status
is checked. This keeps the generator cheap enough to keep up with perf_analyzer (C++) on a
small machine. Each run returns one `RunResult`, the record every measurement in the lab uses.

From a script or a notebook, use the synchronous `closed_loop` / `open_loop`. Ctrl-C stops a
run and returns what it had measured so far. From the shell:

    python -m servelab loadgen --target triton-http --address 127.0.0.1:8200 \
        --model food_classifier_onnx --concurrency 8 --requests 500 --out results.json
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import concurrent.futures
import json
import logging
import math
import signal
import struct
import sys
import threading
import time
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcclient_aio
from tqdm import tqdm
from tritonclient.utils import InferenceServerException
from yarl import URL

from servelab import food11, paths
from servelab.results import LatencySummary, RunResult, save_results

log = logging.getLogger(__name__)

TARGET_KINDS = ("fastapi", "triton-http", "triton-grpc")
ARRIVALS = ("constant", "poisson")
DEFAULT_IMAGE = paths.GOURMETGRAM_DIR / "static" / "samples" / "soup.jpg"
DEFAULT_TIMEOUT_S = 30.0

# An open-loop run fell behind its schedule when its p99 lag exceeds both of these. A lag has to
# be large compared with the gap between arrivals to change the offered load, and large in
# absolute terms to change latencies. Below 10 ms it is noise: asyncio's timers already wake up
# to about 1 ms late (epoll counts in milliseconds), and on a busy 2-core machine the OS often
# runs the generator a few milliseconds after its timer fired. A generator that cannot keep up
# falls further behind with every request, and soon passes both.
LAG_LIMIT_S = 0.010
LAG_LIMIT_FRACTION = 0.1


class RequestError(Exception):
    """One request failed; `kind` is the name it is counted under in `RunResult.errors`."""

    def __init__(self, kind: str, detail: str = "") -> None:
        super().__init__(f"{kind}: {detail}" if detail else kind)
        self.kind = kind
        self.detail = detail


# ---- what one request carries ----------------------------------------------------------------


@dataclass(frozen=True)
class ModelInput:
    """The single input tensor of one request to a Triton model, and the outputs to ask for."""

    name: str
    datatype: str  # KServe v2 datatype: "BYTES" or "FP32"
    array: np.ndarray  # batch of one: shape [1, ...]
    output_names: tuple[str, ...]

    def binary_tensor(self) -> bytes:
        """The tensor in Triton's binary encoding: raw little-endian values; for BYTES, each
        element as a 4-byte little-endian length followed by its bytes."""
        if self.datatype == "BYTES":
            return b"".join(struct.pack("<I", len(item)) + item for item in self.array.flat)
        return self.array.astype("<f4").tobytes()


def model_input(model: str, image_bytes: bytes) -> ModelInput:
    """The request for `model`: the model decides what the image must become before it is sent."""
    if model == "food_classifier":
        # The Python-backend model decodes and preprocesses on the server: send the JPEG, base64.
        encoded = base64.b64encode(image_bytes)
        return ModelInput("INPUT_IMAGE", "BYTES", np.array([[encoded]], dtype=object), ("FOOD_LABEL", "PROBABILITY"))
    if model == "food_classifier_onnx":
        # The bare network: the client preprocesses, and sends 3x224x224 float32 values.
        tensor = food11.preprocess(food11.decode_image_bytes(image_bytes))[None]
        return ModelInput("input", "FP32", tensor, ("output",))
    raise ValueError(f"unknown model {model!r}; the lab serves food_classifier and food_classifier_onnx")


def default_image() -> bytes:
    return DEFAULT_IMAGE.read_bytes()


# ---- targets: one prepared request, sent again and again -----------------------------------


class Target(ABC):
    """A server endpoint with one prepared request. `open` before sending, `close` after.

    The runners open and close the target themselves, so one target can serve several runs.
    """

    name: str

    @abstractmethod
    async def open(self, connections: int) -> None:
        """Connect; up to `connections` requests will be in flight at once."""

    @abstractmethod
    async def send(self) -> None:
        """Send the request and wait for the whole answer; raise `RequestError` if it failed."""

    @abstractmethod
    async def close(self) -> None:
        """Release the connections."""


class _HttpTarget(Target):
    """POST the same body to the same URL, over a pool of kept-alive connections."""

    def __init__(self, name: str, url: str, body: bytes, headers: dict[str, str], timeout_s: float) -> None:
        self.name = name
        self.url = URL(url)  # parsed once, not on every request
        self.body = body
        self.headers = headers
        self.timeout_s = timeout_s
        self._session: aiohttp.ClientSession | None = None

    async def open(self, connections: int) -> None:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=connections),
            timeout=aiohttp.ClientTimeout(total=self.timeout_s),
            cookie_jar=aiohttp.DummyCookieJar(),
            # Without Accept-Encoding, servers do not compress their answers (Triton would gzip
            # them, spending server CPU that perf_analyzer's requests do not ask for).
            skip_auto_headers=("Accept-Encoding", "User-Agent"),
            auto_decompress=False,
        )

    async def send(self) -> None:
        try:
            async with self._session.post(self.url, data=self.body, headers=self.headers) as response:
                answer = await response.read()
        except TimeoutError as exc:  # before ClientConnectionError: aiohttp's timeouts are both
            raise RequestError("timeout", f"no complete answer within {self.timeout_s:g} s") from exc
        except aiohttp.ClientConnectionError as exc:  # refused, reset, closed mid-answer
            raise RequestError("connection", str(exc)) from exc
        except aiohttp.ClientError as exc:
            raise RequestError("http_client_error", str(exc)) from exc
        if response.status != 200:
            raise RequestError(f"http_{response.status}", answer[:300].decode(errors="replace"))

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


class FastAPITarget(_HttpTarget):
    """POST {base_url}/predict with {"image": "<base64 JPEG>"}."""

    def __init__(
        self, base_url: str, image_bytes: bytes, timeout_s: float = DEFAULT_TIMEOUT_S, name: str | None = None
    ) -> None:
        body = json.dumps({"image": base64.b64encode(image_bytes).decode()}).encode()
        super().__init__(
            name or f"fastapi ({base_url})",
            f"{base_url.rstrip('/')}/predict",
            body,
            {"Content-Type": "application/json"},
            timeout_s,
        )


class TritonHttpTarget(_HttpTarget):
    """KServe v2 inference over HTTP, with Triton's binary tensor extension.

    The body is a JSON header describing the tensors, followed directly by the raw tensor
    bytes. `Inference-Header-Content-Length` tells Triton where the JSON ends. Asking for binary
    outputs also spares the server from writing numbers as JSON text. perf_analyzer sends the
    same kind of request.
    """

    def __init__(
        self,
        host_port: str,
        model: str,
        image_bytes: bytes,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        name: str | None = None,
    ) -> None:
        tensor = model_input(model, image_bytes)
        raw = tensor.binary_tensor()
        header = json.dumps(
            {
                "inputs": [
                    {
                        "name": tensor.name,
                        "shape": list(tensor.array.shape),
                        "datatype": tensor.datatype,
                        "parameters": {"binary_data_size": len(raw)},
                    }
                ],
                "outputs": [{"name": output, "parameters": {"binary_data": True}} for output in tensor.output_names],
            }
        ).encode()
        super().__init__(
            name or f"triton/{model} (http)",
            f"http://{_host_port(host_port)}/v2/models/{model}/infer",
            header + raw,
            {"Inference-Header-Content-Length": str(len(header)), "Content-Type": "application/octet-stream"},
            timeout_s,
        )


class TritonGrpcTarget(Target):
    """KServe v2 inference over gRPC, through tritonclient's asyncio client on one channel."""

    def __init__(
        self,
        host_port: str,
        model: str,
        image_bytes: bytes,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        name: str | None = None,
    ) -> None:
        tensor = model_input(model, image_bytes)
        self.name = name or f"triton/{model} (grpc)"
        self.host_port = _host_port(host_port)
        self.model = model
        self.timeout_s = timeout_s
        self.inputs = [grpcclient.InferInput(tensor.name, list(tensor.array.shape), tensor.datatype)]
        self.inputs[0].set_data_from_numpy(tensor.array)  # serialised here, once
        self.outputs = [grpcclient.InferRequestedOutput(output) for output in tensor.output_names]
        self._client: grpcclient_aio.InferenceServerClient | None = None

    async def open(self, connections: int) -> None:
        # gRPC multiplexes every request over the channel's one HTTP/2 connection.
        self._client = grpcclient_aio.InferenceServerClient(self.host_port)

    async def send(self) -> None:
        try:
            await self._client.infer(self.model, self.inputs, outputs=self.outputs, client_timeout=self.timeout_s)
        except InferenceServerException as exc:
            raise RequestError(_grpc_error_kind(exc), exc.message() or "") from exc

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None


def _grpc_error_kind(exc: InferenceServerException) -> str:
    status = exc.status()  # e.g. "StatusCode.UNAVAILABLE"; None when the client itself refused
    if status is None:
        return "triton_error"
    code = status.rsplit(".", 1)[-1]
    return "timeout" if code == "DEADLINE_EXCEEDED" else f"grpc_{code}"


def _host_port(address: str) -> str:
    """Triton addresses are host:port; accept a pasted http:// URL too."""
    return address.split("://", 1)[-1].rstrip("/")


def make_target(
    kind: str,
    address: str,
    model: str | None = None,
    image_bytes: bytes | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> Target:
    """kind: "fastapi" (address: base URL), "triton-http" or "triton-grpc" (address: host:port,
    and a model: food_classifier or food_classifier_onnx). The image defaults to the soup sample."""
    image = default_image() if image_bytes is None else image_bytes
    if kind == "fastapi":
        return FastAPITarget(address, image, timeout_s)
    if kind not in TARGET_KINDS:
        raise ValueError(f"unknown target kind {kind!r}; choose one of {', '.join(TARGET_KINDS)}")
    if not model:
        raise ValueError(f"a {kind} target needs a model: food_classifier or food_classifier_onnx")
    target_class = TritonHttpTarget if kind == "triton-http" else TritonGrpcTarget
    return target_class(address, model, image, timeout_s)


# ---- measuring -----------------------------------------------------------------------------


class _Recorder:
    """Outcomes of one phase of a run (warm-up or measurement), and its progress bar."""

    def __init__(self, description: str, total: int | None, progress: bool) -> None:
        self.latencies_ms: list[float] = []
        self.errors: Counter[str] = Counter()
        self.started = time.perf_counter()
        self.ended: float | None = None
        self.bar = tqdm(total=total, desc=description, unit="req", file=sys.stderr, disable=not progress, leave=False)

    def success(self, latency_s: float) -> None:
        self.latencies_ms.append(latency_s * 1000.0)
        self.bar.update()

    def failure(self, error: RequestError) -> None:
        if error.kind not in self.errors:  # the first of each kind says what went wrong
            log.warning("request failed (%s)%s", error.kind, f": {error.detail}" if error.detail else "")
        self.errors[error.kind] += 1
        self.bar.update()

    @property
    def count(self) -> int:
        return len(self.latencies_ms) + sum(self.errors.values())

    def finish(self) -> None:
        if self.ended is None:
            self.ended = time.perf_counter()
        self.bar.close()

    @property
    def wall_s(self) -> float:
        return max((self.ended or time.perf_counter()) - self.started, 0.0)


async def _timed_send(target: Target, since: float, recorder: _Recorder) -> None:
    """Send once; the latency runs from `since` (the send time, or the scheduled time)."""
    try:
        await target.send()
    except RequestError as error:
        recorder.failure(error)
    else:
        recorder.success(time.perf_counter() - since)


def _check_bounds(requests: int | None, duration_s: float | None) -> None:
    if requests is None and duration_s is None:
        raise ValueError("give requests, duration_s or both: the run stops at whichever comes first")
    if (requests is not None and requests < 1) or (duration_s is not None and duration_s <= 0):
        raise ValueError("requests and duration_s must be positive")


def _interrupted_note(recorder: _Recorder) -> str:
    return f"stopped early by Ctrl-C after {recorder.count} requests"


def _result(target: Target, mode: str, recorder: _Recorder, notes: list[str], **load: Any) -> RunResult:
    successes = len(recorder.latencies_ms)
    wall_s = recorder.wall_s
    return RunResult(
        target=target.name,
        tool="loadgen",
        mode=mode,
        requests=recorder.count,
        throughput_rps=successes / wall_s if wall_s > 0 else 0.0,
        latency=LatencySummary.of(recorder.latencies_ms),
        wall_s=wall_s,
        errors=dict(recorder.errors),
        latencies_ms=recorder.latencies_ms,
        notes=notes,
        **load,
    )


async def _closed_phase(
    target: Target, concurrency: int, requests: int | None, duration_s: float | None, recorder: _Recorder
) -> None:
    """`concurrency` senders, each sending again as soon as it has its answer."""
    limit = math.inf if requests is None else requests
    deadline = math.inf if duration_s is None else recorder.started + duration_s
    issued = 0

    async def sender() -> None:
        nonlocal issued
        # Requests already sent when the deadline passes are waited for and counted.
        while issued < limit and time.perf_counter() < deadline:
            issued += 1  # no await between check and increment: no other sender can interleave
            await _timed_send(target, time.perf_counter(), recorder)

    try:
        # If this is cancelled (Ctrl-C), gather cancels the senders and their requests in flight.
        await asyncio.gather(*(sender() for _ in range(concurrency)))
    finally:
        recorder.finish()


async def run_closed(
    target: Target,
    concurrency: int,
    requests: int | None = None,
    duration_s: float | None = None,
    warmup_requests: int = 0,
    warmup_s: float = 0.0,
    progress: bool = True,
) -> RunResult:
    """Closed loop: `concurrency` senders until `requests` are answered or `duration_s` has passed.

    Warm-up (up to `warmup_requests` requests or `warmup_s` seconds, whichever comes first) runs
    at the same concurrency and is finished before measurement starts, so none of it is counted.
    Cancelling the run (Ctrl-C) returns what was measured until then, with a note saying so.
    """
    _check_bounds(requests, duration_s)
    if concurrency < 1:
        raise ValueError("concurrency must be at least 1")
    log.info("closed loop against %s: concurrency %d, %s", target.name, concurrency, _bounds(requests, duration_s))
    notes: list[str] = []
    recorder: _Recorder | None = None
    await target.open(connections=concurrency)
    try:
        if warmup_requests or warmup_s:
            warmup = _Recorder("warm-up", warmup_requests or None, progress)
            await _closed_phase(target, concurrency, warmup_requests or None, warmup_s or None, warmup)
        recorder = _Recorder(f"c={concurrency}", requests, progress)
        await _closed_phase(target, concurrency, requests, duration_s, recorder)
    except asyncio.CancelledError:
        # Deliberately not re-raised: stopping early is how a user ends a long run, and what
        # was measured so far is the result they asked for.
        recorder = recorder or _Recorder(f"c={concurrency}", requests, progress=False)
        recorder.finish()
        notes.append(_interrupted_note(recorder))
        log.warning("%s", notes[-1])
    finally:
        await target.close()
    return _result(target, "closed", recorder, notes, concurrency=concurrency)


def arrival_offsets(rate_rps: float, arrival: str = "constant", seed: int = 0) -> Iterator[float]:
    """Endless arrival times in seconds from the start: cumulative sums of inter-arrival gaps,
    either all 1/rate ("constant") or exponential with mean 1/rate ("poisson", seeded)."""
    if rate_rps <= 0:
        raise ValueError("rate_rps must be positive")
    if arrival == "constant":
        index = 1
        while True:
            yield index / rate_rps  # multiplied, not summed, so rounding errors do not pile up
            index += 1
    if arrival != "poisson":
        raise ValueError(f"unknown arrival process {arrival!r}; choose one of {', '.join(ARRIVALS)}")
    rng = np.random.default_rng(seed)
    elapsed = 0.0
    while True:
        for gap in rng.exponential(1.0 / rate_rps, size=1024):
            elapsed += float(gap)
            yield elapsed


def _schedule_lag(lags_s: list[float], rate_rps: float) -> dict[str, Any]:
    if not lags_s:
        message = "No request was sent, so there is no schedule lag to report."
        return {"mean_ms": math.nan, "p99_ms": math.nan, "max_ms": math.nan, "fell_behind": False, "message": message}
    lags_ms = np.asarray(lags_s) * 1000.0
    mean_ms, p99_ms, max_ms = float(lags_ms.mean()), float(np.percentile(lags_ms, 99)), float(lags_ms.max())
    limit_ms = max(LAG_LIMIT_S, LAG_LIMIT_FRACTION / rate_rps) * 1000.0
    fell_behind = p99_ms > limit_ms
    if fell_behind:
        message = (
            f"The generator fell behind its schedule: 1% of requests went out more than {p99_ms:.1f} ms late "
            f"(worst {max_ms:.1f} ms; the limit is {limit_ms:.1f} ms). The server was offered less than "
            f"{rate_rps:g} req/s, and the latencies include the lag. Try a lower rate, or perf_analyzer."
        )
    else:
        message = (
            f"The generator kept to its schedule: requests went out {mean_ms:.2f} ms late on average "
            f"(p99 {p99_ms:.2f} ms, worst {max_ms:.2f} ms)."
        )
    return {"mean_ms": mean_ms, "p99_ms": p99_ms, "max_ms": max_ms, "fell_behind": fell_behind, "message": message}


async def run_open(
    target: Target,
    rate_rps: float,
    arrival: str = "constant",
    requests: int | None = None,
    duration_s: float | None = None,
    warmup_s: float = 0.0,
    seed: int = 0,
    max_outstanding: int = 1000,
    progress: bool = True,
) -> RunResult:
    """Open loop: requests at `rate_rps` on a schedule, each sent at its time whatever the others do.

    Arrivals in the first `warmup_s` seconds are sent but not counted. After them come `requests`
    measured arrivals, or `duration_s` seconds of them, whichever ends first. Latency runs from
    the scheduled time. If `max_outstanding` requests are already waiting for answers, a new
    arrival is dropped and counted as a "generator_overload" error. Cancelling the run (Ctrl-C)
    returns what was measured until then, with a note saying so.
    """
    _check_bounds(requests, duration_s)
    if max_outstanding < 1 or warmup_s < 0:
        raise ValueError("max_outstanding must be at least 1, and warmup_s not negative")
    schedule = arrival_offsets(rate_rps, arrival, seed)
    limit = math.inf if requests is None else requests
    end_s = math.inf if duration_s is None else warmup_s + duration_s
    log.info("open loop against %s: %g req/s %s, %s", target.name, rate_rps, arrival, _bounds(requests, duration_s))
    if warmup_s:
        log.info("warming up for %g s", warmup_s)
    warmup = _Recorder("warm-up", None, progress=False)
    recorder: _Recorder | None = None  # created when the first measured request is due
    measured = 0  # measured arrivals so far, sent or dropped
    in_flight: set[asyncio.Task] = set()
    lags_s: list[float] = []
    notes: list[str] = []

    async def scheduled_send(scheduled: float, phase: _Recorder) -> None:
        if phase is not warmup:
            lags_s.append(time.perf_counter() - scheduled)
        await _timed_send(target, scheduled, phase)

    await target.open(connections=max_outstanding)
    started = time.perf_counter()
    try:
        for offset in schedule:
            if offset >= end_s or measured >= limit:
                break
            if offset < warmup_s:
                phase = warmup
            else:
                if recorder is None:
                    warmup.finish()
                    recorder = _Recorder(f"{rate_rps:g} req/s", requests, progress)
                    recorder.started = started + warmup_s
                phase = recorder
                measured += 1
            scheduled = started + offset
            # sleep(0) when late still yields, so that answers are handled between arrivals.
            await asyncio.sleep(max(scheduled - time.perf_counter(), 0.0))
            if len(in_flight) >= max_outstanding:
                phase.failure(RequestError("generator_overload", f"{max_outstanding} requests already outstanding"))
                continue
            task = asyncio.create_task(scheduled_send(scheduled, phase))
            in_flight.add(task)
            task.add_done_callback(in_flight.discard)
        await asyncio.gather(*in_flight)
    except asyncio.CancelledError:
        # As in run_closed, stopping early keeps what was measured. The requests in flight
        # are cancelled, not waited for: their answers may never come.
        for task in in_flight:
            task.cancel()
        await asyncio.gather(*in_flight, return_exceptions=True)
        recorder = recorder or _Recorder(f"{rate_rps:g} req/s", requests, progress=False)
        notes.append(_interrupted_note(recorder))
        log.warning("%s", notes[-1])
    finally:
        warmup.finish()
        if recorder is not None:
            recorder.finish()
        await target.close()
    if recorder is None:  # the run ended within its warm-up
        recorder = _Recorder(f"{rate_rps:g} req/s", requests, progress=False)
        recorder.finish()
    overloaded = recorder.errors.get("generator_overload", 0)
    if overloaded:
        notes.append(
            f"{overloaded} requests were not sent because {max_outstanding} were already waiting for answers: "
            f"the server could not keep up with {rate_rps:g} req/s. The latencies understate what users "
            "would have seen; lower the rate, or raise max_outstanding."
        )
        log.warning("%s", notes[-1])
    lag = _schedule_lag(lags_s, rate_rps)
    if lag["fell_behind"]:
        log.warning("%s", lag["message"])
    result = _result(target, "open", recorder, notes, rate_rps=rate_rps, arrival=arrival)
    result.schedule_lag = lag
    return result


def _bounds(requests: int | None, duration_s: float | None) -> str:
    parts = ([f"{requests} requests"] if requests is not None else []) + (
        [f"{duration_s:g} s"] if duration_s is not None else []
    )
    return " or ".join(parts) + (", whichever comes first" if len(parts) == 2 else "")


# ---- from synchronous code: scripts, notebooks, the command line ---------------------------


def _run_sync(run: Coroutine[Any, Any, RunResult]) -> RunResult:
    """Run a measurement to its end from synchronous code, and keep its result on Ctrl-C.

    The event loop runs in a worker thread, in a script and in a notebook alike: in Jupyter
    the main thread's loop is already running, and no second loop can run there. The main thread
    only waits, so it is the one that gets Ctrl-C (KeyboardInterrupt). It then cancels the run,
    which closes its target and returns what it had measured.
    """
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="servelab-loadgen", daemon=True)
    thread.start()
    try:
        task = asyncio.run_coroutine_threadsafe(_start_task(run), loop).result()
        outcome = asyncio.run_coroutine_threadsafe(_wait_for(task), loop)
        try:
            return _interruptible_result(outcome)
        except KeyboardInterrupt:
            log.warning("Ctrl-C: stopping the run (press it again to abandon it)")
            loop.call_soon_threadsafe(task.cancel)
            return _interruptible_result(outcome)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()


def _interruptible_result(outcome: concurrent.futures.Future[RunResult]) -> RunResult:
    # Python raises KeyboardInterrupt only when the main thread runs Python code. A wait that
    # never times out would not notice a SIGINT that the OS delivered to another thread.
    while True:
        try:
            return outcome.result(timeout=0.1)
        except concurrent.futures.TimeoutError:
            continue


async def _start_task(run: Coroutine[Any, Any, RunResult]) -> asyncio.Task:
    return asyncio.ensure_future(run)


async def _wait_for(task: asyncio.Task) -> RunResult:
    # Awaited from a second coroutine so that cancelling `task` leaves this one waiting for the
    # partial result that the cancelled run returns.
    return await task


def closed_loop(
    kind: str,
    address: str,
    concurrency: int,
    requests: int | None = None,
    duration_s: float | None = None,
    warmup_requests: int = 0,
    warmup_s: float = 0.0,
    progress: bool = True,
    model: str | None = None,
    image_bytes: bytes | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> RunResult:
    """`run_closed` against `make_target(kind, address, model, image_bytes, timeout_s)`, from
    synchronous code (a script or a notebook cell). Ctrl-C returns the partial result."""
    target = make_target(kind, address, model, image_bytes, timeout_s)
    return _run_sync(run_closed(target, concurrency, requests, duration_s, warmup_requests, warmup_s, progress))


def open_loop(
    kind: str,
    address: str,
    rate_rps: float,
    arrival: str = "constant",
    requests: int | None = None,
    duration_s: float | None = None,
    warmup_s: float = 0.0,
    seed: int = 0,
    max_outstanding: int = 1000,
    progress: bool = True,
    model: str | None = None,
    image_bytes: bytes | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> RunResult:
    """`run_open` against `make_target(kind, address, model, image_bytes, timeout_s)`, from
    synchronous code (a script or a notebook cell). Ctrl-C returns the partial result."""
    target = make_target(kind, address, model, image_bytes, timeout_s)
    return _run_sync(
        run_open(target, rate_rps, arrival, requests, duration_s, warmup_s, seed, max_outstanding, progress)
    )


def summarize(result: RunResult) -> str:
    """One paragraph in words: load, throughput, latency percentiles, errors, and any notes."""
    latency = result.latency
    if result.mode == "closed":
        load = f"Closed loop, {result.concurrency} concurrent senders"
    else:
        load = f"Open loop, {result.rate_rps:g} req/s offered ({result.arrival} arrivals)"
    errors = ", ".join(f"{count} {kind}" for kind, count in sorted(result.errors.items())) or "none"
    parts = [
        f"{load}, against {result.target}: {result.requests} requests in {result.wall_s:.1f} s, "
        f"{result.throughput_rps:.1f} successful req/s.",
        f"Latency{' from the scheduled send time' if result.mode == 'open' else ''}: "
        f"p50 {latency.p50_ms:.1f} ms, p95 {latency.p95_ms:.1f} ms, p99 {latency.p99_ms:.1f} ms, "
        f"max {latency.max_ms:.1f} ms (mean {latency.mean_ms:.1f} ms).",
        f"Errors: {errors}.",
    ]
    if result.schedule_lag:
        parts.append(result.schedule_lag["message"])
    parts += [note[0].upper() + note[1:] + ("" if note.endswith(".") else ".") for note in result.notes]
    return " ".join(parts)


def main(argv: list[str] | None = None) -> int:
    """`python -m servelab loadgen ...`: one run, a summary on stdout, optionally saved as JSON."""
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(
        prog="python -m servelab loadgen",
        description="Load a FastAPI service or Triton with a closed loop (--concurrency) or an open loop (--rate).",
    )
    parser.add_argument("--target", required=True, choices=TARGET_KINDS)
    parser.add_argument(
        "--address", required=True, help="FastAPI: base URL (http://127.0.0.1:8101); Triton: host:port"
    )
    parser.add_argument("--model", help="Triton model: food_classifier or food_classifier_onnx")
    parser.add_argument("--image", type=Path, default=DEFAULT_IMAGE, help="the image every request sends")
    load = parser.add_mutually_exclusive_group(required=True)
    load.add_argument("--concurrency", type=int, help="closed loop: this many requests in flight")
    load.add_argument("--rate", type=float, help="open loop: requests per second, on a schedule")
    parser.add_argument("--arrival", choices=ARRIVALS, default="constant", help="open loop: gaps between arrivals")
    parser.add_argument("--requests", type=int, help="stop after this many measured requests")
    parser.add_argument("--duration", type=float, help="stop after this many seconds of measurement")
    parser.add_argument("--warmup-s", type=float, default=0.0, help="seconds of unmeasured requests first")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="per-request timeout, seconds")
    parser.add_argument("--out", type=Path, help="save the result here as JSON (servelab.results format)")
    args = parser.parse_args(argv)
    if args.requests is None and args.duration is None:
        parser.error("give --requests, --duration or both (the run stops at whichever comes first)")
    if args.target != "fastapi" and not args.model:
        parser.error("Triton targets need --model food_classifier or --model food_classifier_onnx")
    if args.concurrency is not None and args.arrival != "constant":
        parser.error("--arrival applies to an open loop (--rate), not to --concurrency")

    if threading.current_thread() is threading.main_thread():
        # A shell starts background jobs with SIGINT ignored, and Python keeps that: make Ctrl-C
        # (or `kill -INT`) stop the run cleanly in every case.
        signal.signal(signal.SIGINT, signal.default_int_handler)
    common = {"model": args.model, "image_bytes": args.image.read_bytes(), "timeout_s": args.timeout}
    bounds = {"requests": args.requests, "duration_s": args.duration, "warmup_s": args.warmup_s}
    try:
        if args.concurrency is not None:
            result = closed_loop(args.target, args.address, args.concurrency, **bounds, **common)
        else:
            result = open_loop(args.target, args.address, args.rate, args.arrival, **bounds, **common)
    except ValueError as exc:
        log.error("%s", exc)
        return 2
    print(summarize(result))
    if args.out:
        save_results([result], args.out, metadata={"command": ["loadgen", *argv]})
        print(f"Saved to {args.out}")
    if any(note.startswith("stopped early by Ctrl-C") for note in result.notes):
        return 130  # the shell's code for "ended by SIGINT", though the partial result was kept
    return 0 if result.latencies_ms or not result.requests else 1


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    sys.exit(main())
