"""The HTTP side of a Food-11 prediction service, shared by the PyTorch and the ONNX FastAPI apps.

Each app hands `create_app` a `ServedModel`: where its runtime runs the model (devices.py: the
device the runtime reports once loaded, which may be the CPU where the GPU was asked for), and a
`load` that builds the model and returns a function that turns a batch [N, 3, 224, 224] into
logits [N, 11]. Everything else (request and response schemas, error codes, the request size
limit, where decoding and inference run, how many threads) is defined here once. `python -m
servelab artifacts` copies this file into each service folder; edit it here.

Where the work runs, and why:
- An image sent by URL is downloaded on the event loop (asynchronous I/O, image_fetch.py), by
  default before the request takes a predict slot, so downloads overlap each other and the
  model; IMAGE_DOWNLOAD_PLACEMENT=inside_slot holds the slot during the download instead (the
  naive design, kept for the lab's experiment).
- Base64 and image decoding plus preprocessing run in a thread pool (PREPROCESS_WORKERS), off
  the event loop, so a slow decode never blocks other requests from being accepted, and a decode
  can overlap with an inference in progress.
- Decoding runs at most DECODE_AHEAD requests ahead of the predict slots (default: two per slot,
  and at least one per decoding thread): a request is decoded only when there is room among those
  being decoded or decoded and waiting for a slot; the rest wait undecoded. Memory stays bounded
  however many clients send, and on a CPU the decoding thread does not run far ahead, taking
  cores from the inferences and leaving tensors to go cold before their slot (measured with the
  ONNX service on 2 cores at 16 clients: 3-7% more throughput than with no bound).
- Only the model call is limited: it runs in a pool of PREDICT_CONCURRENCY threads, the predict
  slots. Requests beyond that wait, for room to be decoded and then in the pool's queue: the two
  waits together are the queueing delay the lab measures (the slot wait). A slot that frees
  takes the next request from the queue itself, with no round trip through the event loop
  (which, on a busy machine, may not run for a while: measured with the ONNX service on 2 cores
  at 16 clients, slots handed out by the event loop left the cores about 8% idle, and the
  service about 8% slower).
- Threads are a resource (cores.py): by default there is one slot per core, and an inference
  gets the cores divided by the inferences running when it starts (a lone request uses every
  core; under load each slot has one), so the busy threads never outnumber the cores. The model
  is built on an inference thread, so that no other thread ever starts a team of threads for it:
  a second, idle team slows every inference of the first.
- A request whose client has gone is abandoned at its next stage boundary (client_gone.py):
  before preprocessing (once there is room to decode it), while it waits for a slot, before
  inference. ABANDON_ON_DISCONNECT=off
  computes it anyway, for the lab's experiment.
- /metrics (predict_metrics.py) has the server's own account of each stage's time, and of the
  requests abandoned and the inferences run for clients who had gone.
- POST /refine (refine_api.py) streams a photo classified over N steps, each step an inference in
  the same slots, and stops at the next step once its client has gone.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from http import HTTPStatus
from pathlib import Path
from typing import Literal

import httpx
import numpy as np
from fastapi import FastAPI, HTTPException, Request, Response, status
from pydantic import BaseModel, Field, model_validator
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from servelab.service.client_gone import CLIENT_CLOSED_REQUEST, ClientGone, DisconnectWatch, watching
from servelab.service.cores import ThreadPlan, positive_int_setting, thread_plan
from servelab.service.devices import Placement, device_setting
from servelab.service.food11 import (
    InvalidImageError,
    decode_base64_image,
    decode_image_bytes,
    preprocess,
    read_weights_info,
    top_prediction,
)
from servelab.service.image_fetch import DEFAULT_ALLOWED_HOSTS, AllowList, DownloadError, download
from servelab.service.predict_metrics import CountPredictRequests, PredictMetrics
from servelab.service.refine_api import add_refine_route

log = logging.getLogger("food11.service")

DEFAULT_MAX_REQUEST_BYTES = 16 * 1024 * 1024
# 413 by the standard library's name: Starlette renamed its constant (CONTENT_TOO_LARGE) and warns on the old one.
TOO_LARGE = HTTPStatus.REQUEST_ENTITY_TOO_LARGE
PLACEMENTS = ("outside_slot", "inside_slot")
# How long an over-limit body is read and thrown away before the 413 is sent: a client that sends
# its whole body before reading the answer (Python's urllib) otherwise gets a connection reset.
DRAIN_LIMIT_S = 10.0


def _positive_int_from_env(name: str, default: int | None) -> int | None:
    try:
        value = positive_int_setting(name, os.environ)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    return default if value is None else value


def _float_from_env(name: str, default: float) -> float:
    raw = os.environ.get(name, "").strip()
    try:
        value = float(raw) if raw else default
    except ValueError:
        raise SystemExit(f"{name}={raw!r} is not a number of seconds.") from None
    if value <= 0:
        raise SystemExit(f"{name}={value} must be above 0.")
    return value


def _placement_from_env() -> str:
    placement = os.environ.get("IMAGE_DOWNLOAD_PLACEMENT", "outside_slot").strip() or "outside_slot"
    if placement not in PLACEMENTS:
        raise SystemExit(f"IMAGE_DOWNLOAD_PLACEMENT={placement!r}: use {' or '.join(PLACEMENTS)}.")
    return placement


def _allow_list_from_env() -> AllowList:
    try:
        return AllowList.parse(os.environ.get("IMAGE_URL_ALLOWED_HOSTS", DEFAULT_ALLOWED_HOSTS))
    except ValueError as exc:
        raise SystemExit(str(exc)) from None


def _switch_from_env(name: str, default: bool) -> bool:
    raw = os.environ.get(name, "").strip().lower()
    if not raw:
        return default
    if raw in ("on", "true", "1", "yes"):
        return True
    if raw in ("off", "false", "0", "no"):
        return False
    raise SystemExit(f"{name}={raw!r}: use on or off.")


def device_setting_from_env() -> str:
    """INFERENCE_DEVICE (devices.py): auto, cuda or cpu."""
    try:
        return device_setting(os.environ)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None


def _thread_plan_from_env(device: str) -> ThreadPlan:
    try:
        return thread_plan(device=device)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None


@dataclass
class ServiceSettings:
    """Tunables read from the environment at start-up."""

    preprocess_workers: int | None = field(default_factory=lambda: _positive_int_from_env("PREPROCESS_WORKERS", None))
    max_request_bytes: int = field(
        default_factory=lambda: _positive_int_from_env("MAX_REQUEST_BYTES", DEFAULT_MAX_REQUEST_BYTES)
    )
    allowed_hosts: AllowList = field(default_factory=_allow_list_from_env)
    download_timeout_s: float = field(default_factory=lambda: _float_from_env("IMAGE_DOWNLOAD_TIMEOUT_S", 10.0))
    download_placement: str = field(default_factory=_placement_from_env)
    abandon_on_disconnect: bool = field(default_factory=lambda: _switch_from_env("ABANDON_ON_DISCONNECT", True))
    decode_ahead: int | None = field(default_factory=lambda: _positive_int_from_env("DECODE_AHEAD", None))


@dataclass
class ServedModel:
    """What a service needs to know about the model it serves."""

    model_file: Path
    placement: Placement  # where the runtime runs the model, as it reports once the model is loaded
    # Builds the model for a thread plan and returns run(batch, threads) -> logits, which runs the
    # batch with that many intra-op threads (one of plan.thread_counts()). Called once, on an
    # inference thread.
    load: Callable[[ThreadPlan], Callable[[np.ndarray, int], np.ndarray]]


def default_preprocess_workers(device: str, plan: ThreadPlan) -> int:
    """On a CPU, one decoding thread: a decode costs a fraction of an inference, and every extra
    thread would take cores from the inference threads. On a GPU, decoding is the CPU's main
    work, so it gets every core."""
    return plan.cores if device.startswith("cuda") else 1


def default_decode_ahead(plan: ThreadPlan, preprocess_workers: int) -> int:
    """Two requests per slot (one for it to take next, one to decode meanwhile), and never fewer
    than the decoding threads, which would leave some of them idle."""
    return max(2 * plan.slots, preprocess_workers)


class PredictRequest(BaseModel):
    """Exactly one of `image` and `url`."""

    image: str | None = Field(None, min_length=1, description="A JPEG or PNG file, base64-encoded.")
    url: str | None = Field(
        None, min_length=1, description="An http(s) URL of the photo, on a host in IMAGE_URL_ALLOWED_HOSTS."
    )

    @model_validator(mode="after")
    def exactly_one_source(self) -> PredictRequest:
        if (self.image is None) == (self.url is None):
            raise ValueError("send exactly one of `image` (the photo, base64-encoded) and `url` (where to fetch it)")
        return self


class PredictResponse(BaseModel):
    prediction: str = Field(..., description="The most likely Food-11 class.")
    probability: float = Field(..., ge=0, le=1, description="Its softmax probability.")


class ErrorResponse(BaseModel):
    detail: str


class HealthResponse(BaseModel):
    status: Literal["ready"]
    model_file: str
    weights: str = Field(..., description="'trained', 'untrained' or 'unknown'.")
    weights_note: str
    runtime: str = Field(..., description="The runtime, and for ONNX Runtime the execution provider it runs on.")
    device: str = Field(..., description="Where the model runs, as the runtime reports it: cpu, or cuda (GPU name).")
    device_asked: str = Field(..., description="What the runtime was asked for (INFERENCE_DEVICE: auto, cuda, cpu).")
    device_fallback: str | None = Field(
        ..., description="Asked for the GPU, runs on the CPU: why, in the runtime's words; null otherwise."
    )
    predict_concurrency: int = Field(..., description="Inference slots: inferences that run at once.")
    inference_threads: int = Field(..., description="Threads each inference uses (intra-op threads).")
    cores: int = Field(..., description="Cores this process may use (CPU affinity and container quota).")
    threads: str = Field(..., description="The thread plan in words, and what chose it.")
    preprocess_workers: int
    decode_ahead: int = Field(..., description="Requests decoded, or being decoded, ahead of the predict slots.")
    max_request_bytes: int
    download_placement: str = Field(..., description="Where a download by URL runs: outside_slot or inside_slot.")
    image_url_allowed_hosts: str
    image_download_timeout_s: float
    abandon_on_disconnect: bool = Field(
        ...,
        description="ABANDON_ON_DISCONNECT: a request whose client has gone stops at its next stage, "
        "a /refine stream at its next step.",
    )


class RequestBodyLimit:
    """Refuse request bodies over a byte limit with 413, before they are read into memory.

    A declared Content-Length over the limit is refused at once; a body sent without one
    (chunked) is counted as it arrives and refused when it crosses the limit.
    """

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    def _too_large(self) -> HTTPException:
        return HTTPException(
            status_code=TOO_LARGE,
            detail=f"Request body is larger than {self.max_bytes} bytes. Send a smaller image "
            "(the model only sees 224x224 pixels) or raise MAX_REQUEST_BYTES on the server.",
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await _drain(receive, more=True)
            await _send_json_error(send, self._too_large())
            return
        received = 0

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    await _drain(receive, more=message.get("more_body", False))
                    raise self._too_large()
            return message

        await self.app(scope, counting_receive, send)


async def _drain(receive: Receive, more: bool) -> None:
    """Read and discard the rest of a request body, for at most DRAIN_LIMIT_S, so that the client
    has sent everything and reads the error instead of a reset connection."""
    try:
        async with asyncio.timeout(DRAIN_LIMIT_S):
            while more:
                message = await receive()
                more = message["type"] == "http.request" and message.get("more_body", False)
    except TimeoutError:
        log.warning("Gave up reading an over-limit body after %.0f s; the client may see a reset.", DRAIN_LIMIT_S)


async def _send_json_error(send: Send, error: HTTPException) -> None:
    body = ErrorResponse(detail=str(error.detail)).model_dump_json().encode()
    await send(
        {
            "type": "http.response.start",
            "status": error.status_code,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


def _decode_and_preprocess(image: str | bytes) -> np.ndarray:
    """A base64 string (sent in the request) or file bytes (downloaded) -> a batch of one."""
    decoded = decode_base64_image(image) if isinstance(image, str) else decode_image_bytes(image)
    return preprocess(decoded)[np.newaxis]


def create_app(model: ServedModel, title: str, description: str) -> FastAPI:
    settings = ServiceSettings()
    placement = model.placement
    # Planned for the device the model runs on, not the one asked for: a GPU's one slot on a CPU
    # would leave all but one core idle.
    plan = _thread_plan_from_env(placement.device)  # PREDICT_CONCURRENCY, INFERENCE_THREADS
    preprocess_workers = settings.preprocess_workers or default_preprocess_workers(placement.device, plan)
    decode_ahead = settings.decode_ahead or default_decode_ahead(plan, preprocess_workers)
    weights = read_weights_info(model.model_file)
    weights_note = weights.get("note", "")
    if weights.get("weights") != "trained":
        log.warning("Serving %s with %s weights: %s", model.model_file.name, weights.get("weights"), weights_note)
    if placement.fallback is not None:
        log.warning("%s", placement.fallback_warning())
    (log.warning if plan.oversubscribed else log.info)("threads: %s", plan.describe())
    preprocess_pool = ThreadPoolExecutor(preprocess_workers, thread_name_prefix="preprocess")
    inference_pool = ThreadPoolExecutor(plan.slots, thread_name_prefix="inference")  # the predict slots
    run_model = inference_pool.submit(model.load, plan).result()
    metrics = PredictMetrics()
    running = 0  # inferences running now, changed by the inference threads under running_lock
    running_lock = threading.Lock()
    # Room to decode: taken by a decoding thread before it decodes, given back when a slot takes
    # the batch (or when the request leaves the slot's queue without it).
    decode_room = threading.BoundedSemaphore(decode_ahead)
    # Never the environment's proxies: the allow-list is about where this server connects.
    downloads = httpx.AsyncClient(trust_env=False, follow_redirects=False)

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        log.info(
            "%s on %s, %s, preprocess_workers=%d, decode_ahead=%d, downloads %s from %s, abandon_on_disconnect=%s",
            model.model_file.name,
            placement.describe(),
            plan.describe(),
            preprocess_workers,
            decode_ahead,
            settings.download_placement,
            settings.allowed_hosts.text,
            settings.abandon_on_disconnect,
        )
        yield
        await downloads.aclose()
        preprocess_pool.shutdown(cancel_futures=True)
        inference_pool.shutdown(cancel_futures=True)

    app = FastAPI(title=title, description=description, version="1.0.0", lifespan=lifespan)
    app.add_middleware(RequestBodyLimit, max_bytes=settings.max_request_bytes)
    app.add_middleware(CountPredictRequests, metrics=metrics)

    async def fetch(url: str) -> bytes:
        started = time.perf_counter()
        try:
            return await download(
                downloads, url, settings.allowed_hosts, settings.max_request_bytes, settings.download_timeout_s
            )
        except DownloadError as exc:
            raise HTTPException(exc.status, str(exc)) from exc
        finally:
            metrics.download_s.observe(time.perf_counter() - started)

    def decode_now(image: str | bytes) -> np.ndarray:
        started = time.perf_counter()
        try:
            return _decode_and_preprocess(image)
        except InvalidImageError as exc:
            raise HTTPException(status.HTTP_400_BAD_REQUEST, str(exc)) from exc
        finally:
            metrics.preprocess_s.observe(time.perf_counter() - started)

    def decode_with_room(image: str | bytes, watch: DisconnectWatch) -> tuple[np.ndarray, float]:
        """In a decoding thread: wait for room ahead of the slots, then decode. Returns the batch,
        and the seconds it took to decode (which are not part of the slot wait)."""
        decode_room.acquire()
        started = time.perf_counter()
        try:
            watch.check("before_preprocess")
            return decode_now(image), time.perf_counter() - started
        except BaseException:
            decode_room.release()
            raise

    def room_given_back_unless_failed(decoding: Future) -> None:
        if not decoding.cancelled() and decoding.exception() is None:
            decode_room.release()

    def room_given_back_if_left_queued(job: Future) -> None:
        if job.cancelled():  # its client left while it waited for a slot: no slot takes its batch
            decode_room.release()

    async def decode(image: str | bytes, watch: DisconnectWatch) -> tuple[np.ndarray, float]:
        decoding = preprocess_pool.submit(decode_with_room, image, watch)
        try:
            return await asyncio.wrap_future(decoding)
        except asyncio.CancelledError:
            # The handler itself was cancelled (Ray Serve does that): a batch decoded now would
            # never reach a slot, so its room is given back when the decoding ends.
            decoding.add_done_callback(room_given_back_unless_failed)
            raise

    def infer(batch: np.ndarray) -> np.ndarray:
        """Run the model on an inference thread (a predict slot), with the threads the plan gives
        an inference that starts while the others run."""
        nonlocal running
        with running_lock:
            running += 1
            threads = plan.threads_for(running)
        try:
            return run_model(batch, threads)
        except Exception as exc:
            log.exception("Inference failed on a batch of shape %s", batch.shape)
            raise HTTPException(
                status.HTTP_500_INTERNAL_SERVER_ERROR,
                f"Inference failed ({type(exc).__name__}); the server log has the traceback.",
            ) from exc
        finally:
            with running_lock:
                running -= 1

    def in_slot(prepare: Callable[[], np.ndarray], queued_at: float, watch: DisconnectWatch) -> np.ndarray:
        """A request's work in its predict slot (an inference thread): `prepare` gives the batch
        (the naive design downloads and decodes it here, holding the slot), then the model runs."""
        metrics.slot_wait_s.observe(time.perf_counter() - queued_at)
        batch = prepare()
        watch.check("before_inference")
        started = time.perf_counter()
        try:
            return infer(batch)
        finally:
            metrics.inference_s.observe(time.perf_counter() - started)
            if watch.gone.is_set():
                metrics.inferences_for_gone_clients.inc()

    async def compute(request: PredictRequest, watch: DisconnectWatch) -> np.ndarray:
        if request.url is not None and settings.download_placement == "inside_slot":
            # The naive design: the slot, and with it the model, waits while the bytes travel
            # (downloaded on the event loop, while the slot's thread waits for them).
            loop = asyncio.get_running_loop()

            def download_and_decode() -> np.ndarray:
                watch.check("before_preprocess")
                return decode_now(asyncio.run_coroutine_threadsafe(fetch(request.url), loop).result())

            job = inference_pool.submit(in_slot, download_and_decode, time.perf_counter(), watch)
        else:
            image = request.image if request.url is None else await fetch(request.url)
            queued_at = time.perf_counter()  # a download is not a wait for the slot
            batch, decode_s = await decode(image, watch)

            def prepare() -> np.ndarray:
                decode_room.release()  # the slot has taken the batch
                return batch

            # The slot wait is every wait from here on, before and after decoding.
            job = inference_pool.submit(in_slot, prepare, queued_at + decode_s, watch)
            job.add_done_callback(room_given_back_if_left_queued)
        return await watch.result_of(job)

    @app.post(
        "/predict",
        response_model=PredictResponse,
        responses={
            status.HTTP_400_BAD_REQUEST: {"model": ErrorResponse, "description": "Not a decodable image, or a bad URL"},
            status.HTTP_403_FORBIDDEN: {"model": ErrorResponse, "description": "URL host not allowed"},
            TOO_LARGE: {
                "model": ErrorResponse,
                "description": "Body or image too large",
            },
            status.HTTP_500_INTERNAL_SERVER_ERROR: {"model": ErrorResponse, "description": "Inference failed"},
            CLIENT_CLOSED_REQUEST: {"model": ErrorResponse, "description": "The client left; nobody reads this"},
            status.HTTP_502_BAD_GATEWAY: {"model": ErrorResponse, "description": "The image host failed"},
            status.HTTP_504_GATEWAY_TIMEOUT: {"model": ErrorResponse, "description": "The download took too long"},
        },
    )
    async def predict(request: PredictRequest, connection: Request) -> PredictResponse:
        # The body has been read: from here on, the connection can only tell that the client left.
        async with watching(connection.receive, settings.abandon_on_disconnect) as watch:
            try:
                logits = await compute(request, watch)
            except ClientGone as gone:
                metrics.abandoned.labels(gone.stage).inc()
                log.info("Abandoned a request at %s: its client disconnected", gone.stage)
                raise HTTPException(
                    CLIENT_CLOSED_REQUEST, "The client disconnected before its answer was ready; it was not computed."
                ) from None
        label, probability = top_prediction(logits)[0]
        return PredictResponse(prediction=label, probability=probability)

    # POST /refine: a photo classified over N steps, streamed, from the same slots (refine_api.py).
    add_refine_route(app, inference_pool, infer, preprocess_pool, metrics, settings.abandon_on_disconnect)

    @app.get("/metrics", include_in_schema=False)
    async def prometheus_metrics() -> Response:
        body, content_type = metrics.exposition()
        return Response(body, media_type=content_type)

    @app.get("/health", response_model=HealthResponse)
    @app.get("/healthz", response_model=HealthResponse, include_in_schema=False)
    async def health() -> HealthResponse:
        return HealthResponse(
            status="ready",
            model_file=model.model_file.name,
            weights=weights.get("weights", "unknown"),
            weights_note=weights_note,
            runtime=placement.runtime,
            device=placement.device,
            device_asked=placement.asked,
            device_fallback=placement.fallback,
            predict_concurrency=plan.slots,
            inference_threads=plan.threads,
            cores=plan.cores,
            threads=plan.describe(),
            preprocess_workers=preprocess_workers,
            decode_ahead=decode_ahead,
            max_request_bytes=settings.max_request_bytes,
            download_placement=settings.download_placement,
            image_url_allowed_hosts=settings.allowed_hosts.text,
            image_download_timeout_s=settings.download_timeout_s,
            abandon_on_disconnect=settings.abandon_on_disconnect,
        )

    return app
