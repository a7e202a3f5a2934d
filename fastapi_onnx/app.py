"""Food-11 classifier served with ONNX Runtime behind FastAPI. From this folder, after `make artifacts`:

    WEB_CONCURRENCY=$(python app.py) uvicorn app:app --host 127.0.0.1 --port 8000

POST /predict {"image": "<JPEG or PNG, base64>"} or {"url": "http://..."} -> {"prediction": ..., "probability": ...}
POST /refine  {"image": ..., "steps": 16} -> one JSON line per step, the answer so far
GET  /health: where the model runs, how this process serves; /metrics: Prometheus's; /docs: the API
Every setting is an environment variable, read once below (docs/settings.md lists them).
"""

import asyncio
import collections
import contextlib
import functools
import json
import logging
import os
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import numpy as np
import onnxruntime as ort
import prometheus_client as prom
from fastapi import FastAPI, HTTPException, Request, Response
from fastapi.responses import StreamingResponse
from prometheus_client import multiprocess
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

import food11

logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
log = logging.getLogger("fastapi_onnx")


def setting(name: str, default, choices: tuple = ()):  # `name` as `default`'s type, above 0 or one of `choices`
    raw = os.environ.get(name, "").strip().lower()
    with contextlib.suppress(ValueError):
        value = type(default)(raw) if raw else default
        if value in choices if choices else value > 0:
            return value
    what = f"one of {', '.join(choices)}" if choices else f"a {'whole ' * isinstance(default, int)}number above 0"
    raise SystemExit(f"{name}={raw!r} is not {what}: set {what}, or unset it for {default}.")


MODEL_PATH = Path(os.environ.get("FOOD11_MODEL_PATH") or Path(__file__).with_name("food11.onnx"))
DEVICE = setting("INFERENCE_DEVICE", "auto", ("auto", "cuda", "cpu"))  # auto: the GPU where ONNX Runtime has one
MAX_REQUEST_BYTES = setting("MAX_REQUEST_BYTES", 16 * 1024 * 1024)  # a request body's, and a download's
HOSTS = os.environ.get("IMAGE_URL_ALLOWED_HOSTS", "127.0.0.1:8400")  # `host` (any port) or `host:port`, comma-separated
ALLOWED = {host.strip().lower() for host in HOSTS.split(",") if host.strip()}
if bad := [host for host in ALLOWED if host.count(":") == 1 and not host.rpartition(":")[2].isdigit()]:
    raise SystemExit(f"IMAGE_URL_ALLOWED_HOSTS: {bad[0]!r} is not `host` or `host:port`.")
DOWNLOAD_TIMEOUT_S = setting("IMAGE_DOWNLOAD_TIMEOUT_S", 10.0)  # redirects included
PLACEMENT = setting("IMAGE_DOWNLOAD_PLACEMENT", "outside_slot", ("outside_slot", "inside_slot"))
ABANDON = setting("ABANDON_ON_DISCONNECT", "on", ("on", "off")) == "on"  # stop work for clients who have gone


# ---- the plan: processes, inference slots, threads per inference ----------------------------------------
# A process serves only what Python's interpreter lock lets through: on many cores, several (uvicorn's workers,
# WEB_CONCURRENCY, which each reads for its share of the cores), each with its own model.
CORES_HERE = len(os.sched_getaffinity(0))  # the cores this process may use (taskset, --cpuset-cpus)...
with contextlib.suppress(OSError, ValueError):  # ...within a container's quota (cgroup v2; "max" or no file: none)
    quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()
    CORES_HERE = max(1, min(CORES_HERE, int(quota) // int(period)))
PROCESSES = setting("WEB_CONCURRENCY", 1)
CORES = max(1, CORES_HERE // PROCESSES)  # this process's share
if __name__ == "__main__":  # `python app.py`: on the CPU one per 2 cores; beside a GPU one per 4, at most 4
    gpu = DEVICE != "cpu" and "CUDAExecutionProvider" in ort.get_available_providers()
    print(max(1, min(4, CORES_HERE // 4) if gpu else CORES_HERE // 2))
    raise SystemExit
# A slot: a thread that decodes a photo and runs the model on it, a request at a time, one per core. An inference
# runs on its slot's thread and THREADS - 1 of the session's own, which the slots share: one by default.
SLOTS = setting("PREDICT_CONCURRENCY", CORES)
THREADS = setting("INFERENCE_THREADS", max(1, CORES // SLOTS))
BUSY = SLOTS + THREADS - 1  # the slots' threads, and the THREADS - 1 of the session they share
PLAN = f"{SLOTS} inference slot(s) x {THREADS} thread(s): at most {BUSY} busy threads on {CORES} core(s)"
PLAN += ": MORE THREADS THAN CORES, so every inference is slowed by the others" * (BUSY > CORES)
if PROCESSES > 1 and not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
    raise SystemExit("WEB_CONCURRENCY > 1: set PROMETHEUS_MULTIPROC_DIR to an empty folder, for /metrics to add up.")

# ---- the model: proved by one inference on its device; a GPU that cannot run it means the CPU, and why ----
CUDA, CPU = "CUDAExecutionProvider", "CPUExecutionProvider"


def load_model() -> tuple[ort.InferenceSession, dict]:
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = THREADS, 1  # a session's threads: its own
    # Idle threads sleep rather than spin: a spinning thread takes a core from the other slots.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    asked = "cuda" if DEVICE == "cuda" or (DEVICE == "auto" and CUDA in ort.get_available_providers()) else "cpu"
    where = {"device_asked": asked, "device_fallback": None}
    for provider in dict.fromkeys([CUDA if asked == "cuda" else CPU, CPU]):
        try:
            if provider == CUDA:
                if CUDA not in ort.get_available_providers():
                    raise RuntimeError("this ONNX Runtime has no CUDA provider (onnxruntime-gpu has one)")
                ort.preload_dlls()  # the CUDA and cuDNN of the pip packages, wherever pip put them
            session = ort.InferenceSession(str(MODEL_PATH), options, providers=[provider])
            session.disable_fallback()  # a run that fails on the GPU raises, never moves to the CPU unsaid
            if session.get_providers()[0] != provider:
                raise RuntimeError("ONNX Runtime dropped its CUDA provider: its own log, just above, says why")
            started = time.perf_counter()
            run(session, np.zeros((1, 3, 224, 224), np.float32))
            device = "cuda" if provider == CUDA else "cpu"
            runtime = {"runtime": f"onnxruntime {ort.__version__} ({provider})", "device": device}
            return session, where | runtime | {"first_inference_ms": 1000 * (time.perf_counter() - started)}
        except Exception as failed:  # no CUDA library, no kernel for this GPU...
            reason = " / ".join(line.strip() for line in str(failed).splitlines() if line.strip())
            if provider == CPU:
                raise SystemExit(f"The model does not run on the CPU either: {reason}") from failed
            where["device_fallback"] = f"the model did not run on cuda: {reason}"
            log.warning("Asked ONNX Runtime for the GPU (cuda); it runs on the CPU instead. Its reason: %s", reason)


def run(session: ort.InferenceSession, batch: np.ndarray) -> np.ndarray:
    return session.run(["output"], {"input": batch})[0]


# ---- metrics: what each request spent its time on, by the server's own clock ----------------------------
BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
DOWNLOAD = prom.Histogram("predict_download_seconds", "Downloading a photo sent by URL", buckets=BUCKETS_S)
SLOT_WAIT = prom.Histogram("predict_slot_wait_seconds", "Waiting for a free inference slot", buckets=BUCKETS_S)
PREPROCESS = prom.Histogram("predict_preprocess_seconds", "Decoding and preprocessing a photo", buckets=BUCKETS_S)
INFERENCE = prom.Histogram("predict_inference_seconds", "Running the model", buckets=BUCKETS_S)
REQUESTS = prom.Counter("predict_requests", "/predict requests by HTTP status", ["status"])
IN_FLIGHT = prom.Gauge("predict_in_flight", "/predict requests in flight", multiprocess_mode="livesum")
ABANDONED = prom.Counter("predict_abandoned", "Requests dropped as their client had gone, by stage", ["stage"])
FOR_NOBODY = prom.Counter("predict_inferences_for_gone_clients", "Inferences ended after their client left")
STEPS = prom.Counter("refine_steps", "Steps of /refine streams computed")
STEPS_FOR_NOBODY = prom.Counter("refine_steps_for_gone_clients", "/refine steps ended after their client left")
STREAMS = prom.Counter("refine_streams", "/refine streams by how they ended", ["outcome"])
STREAMING = prom.Gauge("refine_running", "/refine streams being computed", multiprocess_mode="livesum")
READY = prom.Gauge("service_processes_ready", "Processes that serve", multiprocess_mode="livesum")
# Each process's own share: the workers share one listening socket, which balances connections, not requests.
ANSWERED = prom.Gauge("predict_requests_by_process", "Requests answered", ["process"], multiprocess_mode="livesum")
CONNECTIONS = prom.Gauge("predict_connections_by_process", "Connections", ["process"], multiprocess_mode="livesum")
METRICS = prom.REGISTRY  # this process's; with several processes, all of theirs (PROMETHEUS_MULTIPROC_DIR)
if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
    multiprocess.MultiProcessCollector(METRICS := prom.CollectorRegistry())

# ---- the requests and answers ---------------------------------------------------------------------------
IMAGE = {"contentEncoding": "base64", "pattern": food11.BASE64_PATTERN}  # what food11.decode_base64 takes
URL = {"format": "uri", "pattern": "^[Hh][Tt][Tt][Pp][Ss]?://[^/?#@]+([/?#]|$)"}  # http(s), a host, no user
ONE_OF = [{"required": [f], "properties": {f: {"type": "string"}}} for f in ("image", "url")]


class PredictRequest(BaseModel):
    """Exactly one of `image` and `url` (a field sent as null counts as not sent)."""

    model_config = ConfigDict(json_schema_extra={"oneOf": ONE_OF})  # what exactly_one checks, published
    image: str | None = Field(None, min_length=1, description="A JPEG or PNG, base64.", json_schema_extra=IMAGE)
    url: str | None = Field(None, min_length=1, description="Where to fetch the photo.", json_schema_extra=URL)

    @model_validator(mode="after")
    def exactly_one(self) -> "PredictRequest":
        if (self.image is None) == (self.url is None):
            raise ValueError("send exactly one of `image` (the photo, base64-encoded) and `url` (where to fetch it)")
        return self


class PredictResponse(BaseModel):
    prediction: str = Field(description="The most likely Food-11 class.")
    probability: float = Field(ge=0, le=1, description="Its softmax probability.")


class RefineRequest(BaseModel):
    image: str = Field(min_length=1, description="A JPEG or PNG, base64.", json_schema_extra=IMAGE)
    steps: int = Field(food11.DEFAULT_STEPS, description=f"Views to classify, 1 to {food11.MAX_STEPS}.")

    @field_validator("steps", mode="before")
    @classmethod
    def from_one_to_the_most(cls, steps: object) -> int:
        return food11.checked_steps(steps)


class Error(BaseModel):
    detail: str


GONE = 499  # nginx's "client closed request": nobody reads it, but the logs and the metrics do
ERRORS = {status: {"model": Error} for status in (400, 403, 413, GONE, 500, 502, 504)}


# ---- the inference slots: where the model runs, and what a client who leaves saves ----------------------
class Slots:
    """`count` threads of their own, the only ones that run the model, one job each at a time; a job waits
    in their queue. The thread idle the shortest takes the next job: a lone request after a load keeps to
    one thread, its core's caches warm, rather than go round them all (measured: about 20% slower)."""

    def __init__(self, count: int) -> None:
        self.jobs, self.idle, self.lock, self.count = collections.deque(), [], threading.Lock(), count
        for number in range(count):
            threading.Thread(target=self.serve, name=f"slot-{number}", daemon=True).start()

    def submit(self, work, *args) -> Future:
        with self.lock:
            self.jobs.append((job := Future(), work, args))
            if self.idle:
                self.idle.pop().set()  # the thread idle the shortest
        return job

    def serve(self) -> None:
        ready, done = threading.Event(), None
        while True:
            with self.lock:
                job, work, args = self.jobs.popleft() if self.jobs else (None, None, ())
                if job is None:
                    ready.clear()
                    self.idle.append(ready)
            if done:  # the last job's answer, only now: the next job of a lone client finds this thread idle
                done()
                done = None
            if job is None:
                ready.wait()
            elif work is None:  # closed
                return
            elif job.set_running_or_notify_cancel():  # not one whose client left while it waited
                try:
                    done = functools.partial(job.set_result, work(*args))
                except BaseException as failed:
                    done = functools.partial(job.set_exception, failed)

    def close(self) -> None:  # each thread ends once the jobs before its end are done
        for _ in range(self.count):
            self.submit(None)


slots = Slots(SLOTS)


async def in_a_slot(request: Request, work, *args, first=None):
    """`work(*args, gone, queued_at)` on a free slot's thread; its answer, or `first` (what it sends first). If
    the client leaves meanwhile, `gone` is set (the slot reads it between stages) and, with ABANDON_ON_DISCONNECT,
    a job still waiting in the queue leaves it: a 499."""
    gone = threading.Event()
    job = slots.submit(work, *args, gone, time.perf_counter())
    answer, left = asyncio.ensure_future(first or asyncio.wrap_future(job)), asyncio.ensure_future(request.receive())
    try:  # after its body, the only message a request gets is a disconnect
        await asyncio.wait([answer, left], return_when=asyncio.FIRST_COMPLETED)
        if left.done() and not left.exception():  # a server that cannot tell raises: the request goes on
            gone.set()
            give_up("slot_wait", ABANDON and job.cancel())  # a job no thread has taken yet leaves the queue
        return await answer, gone
    except asyncio.CancelledError:  # the handler itself was cancelled (Ray Serve does so when its client leaves)
        gone.set()
        job.cancel()
        raise
    finally:
        left.cancel()
        answer.cancel()  # a first answer no longer waited for


def give_up(stage: str, gone: bool) -> None:
    if ABANDON and gone:
        ABANDONED.labels(stage).inc()
        raise HTTPException(GONE, "The client disconnected before its answer was ready; it was not computed.")


def decoded(photo) -> food11.Image.Image:
    try:
        return food11.decode_image_bytes(food11.decode_base64(photo) if isinstance(photo, str) else photo)
    except food11.InvalidImageError as exc:
        raise HTTPException(400, str(exc)) from exc


def infer(batch: np.ndarray, gone: threading.Event) -> np.ndarray:
    try:
        with INFERENCE.time():
            return run(served["model"], batch)
    except Exception as failed:
        log.exception("Inference failed")
        detail = f"Inference failed ({type(failed).__name__}); the server log has the traceback."
        raise HTTPException(500, detail) from failed
    finally:
        FOR_NOBODY.inc(gone.is_set())


def classify(photo, gone: threading.Event, queued_at: float) -> np.ndarray:
    """On a slot's thread: the photo (or its download, to wait for) decoded, preprocessed, through the model."""
    SLOT_WAIT.observe(time.perf_counter() - queued_at)
    give_up("before_preprocess", gone.is_set())
    photo = photo() if callable(photo) else photo  # the naive design downloads here, holding the slot
    with PREPROCESS.time():
        batch = food11.preprocess(decoded(photo))[np.newaxis]
    give_up("before_inference", gone.is_set())
    return infer(batch, gone)


@STREAMING.track_inprogress()
def refinement(image: str, steps: int, say, gone: threading.Event, queued_at: float) -> None:
    """On a slot's thread: the photo through the model `steps` times, a view each, each answer so far said at
    once (`say`); it stops at its next step once the client has gone, unless ABANDON_ON_DISCONNECT=off."""
    SLOT_WAIT.observe(time.perf_counter() - queued_at)
    outcome, mean = "completed", food11.RunningMean()
    try:
        with PREPROCESS.time():
            views = food11.Views([decoded(image)])
        for step in range(1, steps + 1):
            if ABANDON and gone.is_set():
                outcome = "stopped"
                break
            ((label, probability),) = mean.add(infer(views.batch(step), gone))
            STEPS.inc()
            STEPS_FOR_NOBODY.inc(gone.is_set())
            say(json.dumps({"step": step, "steps": steps, "prediction": label, "probability": probability}) + "\n")
    except HTTPException as failed:  # not a photo: a 400 before the stream; the model failed midway: a last line
        outcome = "failed"
        say(failed if mean.steps == 0 else json.dumps({"error": failed.detail}) + "\n")
    finally:
        say(None)
        STREAMS.labels(outcome).inc()


# ---- a photo by URL: fetched from allowed hosts only, outside the slot ------------------------------------
def allowed(url: str) -> str:
    """`url` if it is http(s) with a host and no user, on an allowed host: a server that fetches whatever its
    clients name could be turned against the services behind it (a 400 or a 403 otherwise)."""
    try:
        parts, port = urlsplit(url), urlsplit(url).port
    except ValueError as exc:
        raise HTTPException(400, f"{url!r} is not a valid URL ({exc}).") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise HTTPException(400, f"Only http and https URLs with a host are fetched, not {url!r}.")
    if parts.username or parts.password:
        raise HTTPException(400, "URLs with a user name or password are not fetched: remove them from the URL.")
    host, port = parts.hostname.lower(), port or {"http": 80, "https": 443}[parts.scheme]
    if host not in ALLOWED and f"{host}:{port}" not in ALLOWED:
        listed = f"not in IMAGE_URL_ALLOWED_HOSTS ({HOSTS or 'empty'}). Send the image itself as base64 in `image`"
        raise HTTPException(
            403, f"This server does not fetch images from {host}:{port}: it is {listed}, or use an allowed host."
        )
    return url


async def redirect_allowed(request: httpx.Request) -> None:
    allowed(str(request.url))


# Never through the environment's proxies: the allow-list says where this server connects. No time limit
# of httpx's own (5 s): IMAGE_DOWNLOAD_TIMEOUT_S bounds a whole download, redirects included.
downloads = httpx.AsyncClient(
    trust_env=False, timeout=None, follow_redirects=True, max_redirects=5, event_hooks={"request": [redirect_allowed]}
)


async def fetch(url: str) -> bytes:
    """The photo at `url`, from an allowed host (each redirect too), within the time and byte limits."""
    started, photo = time.perf_counter(), bytearray()
    try:
        async with asyncio.timeout(DOWNLOAD_TIMEOUT_S), downloads.stream("GET", allowed(url)) as response:
            if response.status_code != 200:
                raise HTTPException(502, f"The image host answered {response.status_code} for {url}: check the URL.")
            async for chunk in response.aiter_bytes():
                photo += chunk
                if len(photo) > MAX_REQUEST_BYTES:
                    limit = f"{MAX_REQUEST_BYTES} bytes, the limit for an image: use a smaller one."
                    raise HTTPException(413, f"The image at {url} is larger than {limit}")
            return bytes(photo)
    except TimeoutError:
        late = f"did not arrive within {DOWNLOAD_TIMEOUT_S:g} s: try again, or send the image itself."
        raise HTTPException(504, f"The image at {url} {late}") from None
    except httpx.TooManyRedirects:
        raise HTTPException(502, "More than 5 redirects from the image URL: give the final URL.") from None
    except httpx.HTTPError as exc:
        raise HTTPException(502, f"Could not download {url} ({type(exc).__name__}: {exc}).") from None
    finally:  # a refused URL too
        DOWNLOAD.observe(time.perf_counter() - started)


# ---- start-up, and what every request goes through ------------------------------------------------------
served: dict = {}  # the model and where it runs, once loaded


@contextlib.asynccontextmanager
async def lifespan(app: FastAPI):
    served["model"], served["where"] = await asyncio.wrap_future(slots.submit(load_model))  # on a slot's thread
    weights = food11.read_weights_info(MODEL_PATH)
    served["weights"] = {"weights": weights.get("weights", "unknown"), "weights_note": weights.get("note", "")}
    loudly = log.warning if BUSY > CORES else log.info
    loudly("%s on %s (%s weights); %s", MODEL_PATH.name, served["where"]["device"], weights.get("weights"), PLAN)
    READY.set(1)
    for share in (ANSWERED, CONNECTIONS):  # an idle process shows too, with 0
        share.labels(os.getpid()).inc(0)
    async with downloads:
        yield
    slots.close()
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        multiprocess.mark_process_dead(os.getpid())  # its live gauges no longer count


app = FastAPI(title="Food-11 classifier (ONNX Runtime)", lifespan=lifespan)


class Accounting:
    """Counts /predict requests by status; refuses a body over MAX_REQUEST_BYTES with a 413 at its first part
    (chunked: once it crosses the limit), once its rest is dropped, for a client that sends it all first."""

    def __init__(self, app) -> None:
        self.app, self.clients = app, {}  # the latest client addresses: a new one is a new connection

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        status, received, declared = [500], [0], int(dict(scope["headers"]).get(b"content-length", 0))

        async def counting_receive():
            received[0] += len((message := await receive()).get("body", b""))
            if max(received[0], declared) > MAX_REQUEST_BYTES:
                with contextlib.suppress(TimeoutError):  # its rest dropped, for 10 s at most
                    async with asyncio.timeout(10):
                        while message.get("more_body", False):
                            message = await receive()
                limit = f"larger than {MAX_REQUEST_BYTES} bytes. Send a smaller image (the model only sees 224x224"
                raise HTTPException(413, f"Request body is {limit} pixels) or raise MAX_REQUEST_BYTES on the server.")
            return message

        async def recording_send(message) -> None:
            status[0] = message.get("status", status[0])
            await send(message)

        IN_FLIGHT.inc(scope["path"] == "/predict")
        try:
            await self.app(scope, counting_receive, recording_send)
        finally:
            if scope["path"] == "/predict":
                IN_FLIGHT.dec()
                REQUESTS.labels(status[0]).inc()
                ANSWERED.labels(os.getpid()).inc()
                CONNECTIONS.labels(os.getpid()).inc(scope.get("client") not in self.clients)
                self.clients[scope.get("client")] = self.clients.pop(scope.get("client"), None)
                if len(self.clients) > 4096:
                    del self.clients[next(iter(self.clients))]


app.add_middleware(Accounting)


# ---- the routes -----------------------------------------------------------------------------------------
@app.post("/predict", responses=ERRORS)
async def predict(body: PredictRequest, request: Request) -> PredictResponse:
    """Classify a photo, sent in the request or fetched by URL from an allowed host."""
    if body.url and PLACEMENT == "inside_slot":  # the naive design: the slot, and the model, wait for the bytes
        loop = asyncio.get_running_loop()
        photo = lambda: asyncio.run_coroutine_threadsafe(fetch(body.url), loop).result()  # noqa: E731
    else:  # downloaded before the slot: downloads overlap each other and the model
        photo = await fetch(body.url) if body.url else body.image
    logits, _ = await in_a_slot(request, classify, photo)
    label, probability = food11.top_prediction(logits)[0]
    return PredictResponse(prediction=label, probability=probability)


@app.post("/refine", response_class=StreamingResponse, responses={400: {"model": Error}, GONE: {"model": Error}})
async def refine(body: RefineRequest, request: Request) -> StreamingResponse:
    """Classify the photo over `steps` views, one inference each, streaming the answer so far after each as a
    JSON line. The whole stream takes one slot; once its client has gone, it stops at its next step."""
    lines, loop = asyncio.Queue(), asyncio.get_running_loop()
    say = lambda line: loop.call_soon_threadsafe(lines.put_nowait, line)  # noqa: E731 (from the slot's thread)
    try:
        first, gone = await in_a_slot(request, refinement, body.image, body.steps, say, first=lines.get())
    except HTTPException:  # its client left while it waited for a slot: it never began
        STREAMS.labels("stopped").inc()
        raise
    if isinstance(first, HTTPException):  # not a photo
        raise first

    async def stream():
        line = first
        try:
            while line is not None:
                yield line
                line = await lines.get()
        finally:  # early, once its client has gone: Starlette (Ray Serve too) stops the response then
            gone.set()

    return StreamingResponse(stream(), media_type="application/x-ndjson")


@app.get("/health", responses={503: {"model": Error}})
async def health() -> dict:
    """Where the model runs, and how this process serves; a 503 until every process of the service serves."""
    if (ready := int(METRICS.get_sample_value("service_processes_ready") or 0)) < PROCESSES:
        raise HTTPException(503, f"Starting: {ready} of {PROCESSES} processes serve. Ask again in a few seconds.")
    plan = {"processes": PROCESSES, "process_id": os.getpid(), "cores": CORES, "slots": SLOTS, "threads": PLAN}
    settings = {"max_request_bytes": MAX_REQUEST_BYTES, "image_url_allowed_hosts": HOSTS}
    settings |= {"download_placement": PLACEMENT, "abandon_on_disconnect": ABANDON, "inference_threads": THREADS}
    return {"status": "ready", "model_file": MODEL_PATH.name} | served["weights"] | served["where"] | plan | settings


@app.get("/metrics", include_in_schema=False)
async def prometheus_metrics() -> Response:
    return Response(prom.generate_latest(METRICS), media_type=prom.CONTENT_TYPE_LATEST)
