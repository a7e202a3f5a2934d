"""The HTTP side of a Food-11 prediction service, shared by the PyTorch and the ONNX FastAPI apps.

Each app hands `create_app` a `ServedModel`: where its runtime runs the model (devices.py: the
device the runtime reports once loaded and has run one inference on, which may be the CPU where
the GPU was asked for), and a `load` that readies the model on an inference thread and returns a
function that turns a batch [N, 3, 224, 224] into logits [N, 11]; and the service's settings
(settings.py, read once at start-up). Everything else (request and response schemas, error
codes, the request size limit, where decoding and inference run, how many threads) is defined
here once, with the scheduler (scheduler.py) deciding where and when each request's work runs.

Where the work runs, and why:
- An image sent by URL is downloaded on the event loop (asynchronous I/O, image_fetch.py), by
  default before the request takes a predict slot, so downloads overlap each other and the
  model; IMAGE_DOWNLOAD_PLACEMENT=inside_slot holds the slot during the download instead (the
  naive design, kept for the lab's experiment).
- Decoding runs in a thread pool, at most DECODE_AHEAD requests ahead of the PREDICT_CONCURRENCY
  predict slots, and only the model call holds a slot (scheduler.py says why).
- Threads are a resource (cores.py): by default there is one slot per core, and an inference
  gets the cores divided by the inferences running when it starts (a lone request uses every
  core; under load each slot has one), so the busy threads never outnumber the cores.
- A request whose client has gone is abandoned at its next stage boundary (client_gone.py):
  before preprocessing (once there is room to decode it), while it waits for a slot, before
  inference. ABANDON_ON_DISCONNECT=off computes it anyway, for the lab's experiment.
- /metrics (predict_metrics.py) has the server's own account of each stage's time, and of the
  requests abandoned and the inferences run for clients who had gone.
- POST /refine (refine_api.py) streams a photo classified over N steps, each step an inference in
  the same slots, and stops at the next step once its client has gone.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path
from typing import Literal

import httpx
import numpy as np
from fastapi import FastAPI, HTTPException, Request, Response, status
from pydantic import BaseModel, ConfigDict, Field, model_validator
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from food11 import (
    InvalidImageError,
    decode_base64_image,
    decode_image_bytes,
    preprocess,
    read_weights_info,
    top_prediction,
)
from servelab.service.client_gone import CLIENT_CLOSED_REQUEST, ClientGone, DisconnectWatch, watching
from servelab.service.cores import ThreadPlan
from servelab.service.devices import Placement
from servelab.service.image_fetch import DownloadError, download
from servelab.service.predict_metrics import CountPredictRequests, PredictMetrics
from servelab.service.refine_api import IMAGE_SCHEMA, add_refine_route
from servelab.service.scheduler import EncodedImage, InferenceFailed, Scheduler
from servelab.service.settings import ServiceSettings

log = logging.getLogger("food11.service")

# 413 by the standard library's name: Starlette renamed its constant (CONTENT_TOO_LARGE) and warns on the old one.
TOO_LARGE = HTTPStatus.REQUEST_ENTITY_TOO_LARGE
# How long an over-limit body is read and thrown away before the 413 is sent: a client that sends
# its whole body before reading the answer (Python's urllib) otherwise gets a connection reset.
DRAIN_LIMIT_S = 10.0
# The URLs fetched: http(s), a host, no user name or password (image_fetch.py refuses the rest with a 400).
URL_PATTERN = "^[Hh][Tt][Tt][Pp][Ss]?://[^/?#@]+([/?#]|$)"


@dataclass
class ServedModel:
    """What a service needs to know about the model it serves."""

    model_file: Path
    placement: Placement  # where the runtime runs the model, as it reports once it has run one inference
    # Readies the model for a thread plan and returns run(batch, threads) -> logits, which runs the
    # batch with that many intra-op threads (one of plan.thread_counts()). Called once, on an
    # inference thread.
    load: Callable[[ThreadPlan], Callable[[np.ndarray, int], np.ndarray]]


class PredictRequest(BaseModel):
    """Exactly one of `image` and `url` (a field sent as null counts as not sent)."""

    image: str | None = Field(
        None, min_length=1, description="A JPEG or PNG file, base64-encoded.", json_schema_extra=IMAGE_SCHEMA
    )
    url: str | None = Field(
        None,
        min_length=1,
        description="An http(s) URL of the photo, on a host in IMAGE_URL_ALLOWED_HOSTS.",
        json_schema_extra={"format": "uri", "pattern": URL_PATTERN},
    )
    # What exactly_one_source checks, published: a client or a test generated from the schema knows it.
    model_config = ConfigDict(
        json_schema_extra={
            "oneOf": [
                {"required": ["image"], "properties": {"image": {"type": "string"}}},
                {"required": ["url"], "properties": {"url": {"type": "string"}}},
            ]
        }
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
    first_inference_ms: float | None = Field(
        ...,
        description="One inference of a blank image on `device` at start-up took this long: the device runs the model.",
    )
    processes: int = Field(..., description="Processes that serve, each with the slots and threads below.")
    process_id: int = Field(..., description="The process that answered this request.")
    slots: int = Field(
        ..., description="Inference slots of each process (PREDICT_CONCURRENCY): inferences that run at once."
    )
    inference_threads: int = Field(..., description="Threads each inference uses (intra-op threads).")
    cores: int = Field(..., description="Cores each process may use: its share of the affinity and container quota.")
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


def _decode_and_preprocess(image: EncodedImage) -> np.ndarray:
    """A base64 string (sent in the request) or file bytes (downloaded) -> a batch of one."""
    decoded = decode_base64_image(image) if isinstance(image, str) else decode_image_bytes(image)
    return preprocess(decoded)[np.newaxis]


def create_app(model: ServedModel, title: str, description: str, settings: ServiceSettings) -> FastAPI:
    placement = model.placement
    # Planned for the device the model runs on, not the one asked for: a GPU's one slot on a CPU
    # would leave all but one core idle.
    plan = settings.thread_plan(placement.device)
    preprocess_workers = settings.preprocess_workers_for(placement.device, plan)
    decode_ahead = settings.decode_ahead_for(plan, preprocess_workers)
    weights = read_weights_info(model.model_file)
    weights_note = weights.get("note", "")
    if weights.get("weights") != "trained":
        log.warning("Serving %s with %s weights: %s", model.model_file.name, weights.get("weights"), weights_note)
    if placement.fallback is not None:
        log.warning("%s", placement.fallback_warning())
    (log.warning if plan.oversubscribed else log.info)("threads: %s", plan.describe())
    metrics = PredictMetrics()
    scheduler = Scheduler(
        model.load,
        plan,
        _decode_and_preprocess,
        preprocess_workers=preprocess_workers,
        decode_ahead=decode_ahead,
        metrics=metrics,
    )
    # Never the environment's proxies: the allow-list is about where this server connects. No
    # timeouts of httpx's own (5 s by default): image_fetch.download bounds each download, redirects
    # included, by IMAGE_DOWNLOAD_TIMEOUT_S, the one deadline.
    downloads = httpx.AsyncClient(trust_env=False, follow_redirects=False, timeout=None)

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
        metrics.process_started()
        yield
        await downloads.aclose()
        scheduler.shutdown()
        metrics.process_ended()

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

    async def compute(request: PredictRequest, watch: DisconnectWatch) -> np.ndarray:
        if request.url is not None and settings.download_placement == "inside_slot":
            # The naive design: the slot, and with it the model, waits while the bytes travel
            # (downloaded on the event loop, while the slot's thread waits for them).
            loop, url = asyncio.get_running_loop(), request.url

            def download_and_decode() -> np.ndarray:
                watch.check("before_preprocess")
                return scheduler.decode_now(asyncio.run_coroutine_threadsafe(fetch(url), loop).result())

            return await scheduler.predict_holding_the_slot(download_and_decode, watch)
        # Downloaded first, outside the slot; then decoded ahead of the slots, and run in the first free one.
        if request.url is not None:
            return await scheduler.predict(await fetch(request.url), watch)
        assert request.image is not None, "PredictRequest holds exactly one of image and url"
        return await scheduler.predict(request.image, watch)

    @app.post(
        "/predict",
        response_model=PredictResponse,
        responses={
            status.HTTP_400_BAD_REQUEST: {
                "model": ErrorResponse,
                "description": "The image's bytes are not a JPEG or PNG (or `image` is not base64); "
                "or the URL is not one the server fetches (not http(s), no host, a user name)",
            },
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
            except InvalidImageError as exc:
                raise HTTPException(status.HTTP_400_BAD_REQUEST, str(exc)) from exc
            except InferenceFailed as exc:
                raise HTTPException(status.HTTP_500_INTERNAL_SERVER_ERROR, str(exc)) from exc
        label, probability = top_prediction(logits)[0]
        return PredictResponse(prediction=label, probability=probability)

    # POST /refine: a photo classified over N steps, streamed, from the same slots (refine_api.py).
    add_refine_route(app, scheduler, metrics, settings.abandon_on_disconnect)

    @app.get("/metrics", include_in_schema=False)
    async def prometheus_metrics() -> Response:
        body, content_type = metrics.exposition()
        return Response(body, media_type=content_type)

    processes = settings.processes or 1
    all_started = asyncio.Event()

    @app.get("/health", response_model=HealthResponse, responses={503: {"model": ErrorResponse}})
    @app.get("/healthz", response_model=HealthResponse, include_in_schema=False)
    async def health() -> HealthResponse:
        if not all_started.is_set():  # until every process of the service serves; then for good
            if (ready := metrics.processes_ready()) < processes:
                raise HTTPException(
                    status.HTTP_503_SERVICE_UNAVAILABLE,
                    f"Starting: {ready} of {processes} processes serve. Ask again in a few seconds.",
                )
            all_started.set()
        return HealthResponse(
            status="ready",
            model_file=model.model_file.name,
            weights=weights.get("weights", "unknown"),
            weights_note=weights_note,
            runtime=placement.runtime,
            device=placement.device,
            device_asked=placement.asked,
            device_fallback=placement.fallback,
            first_inference_ms=placement.first_inference_ms,
            processes=processes,
            process_id=os.getpid(),
            slots=plan.slots,
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
