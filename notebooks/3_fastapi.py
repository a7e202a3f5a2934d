# %% [markdown]
# # 3. Wrapping the model in FastAPI
#
# GourmetGram, our food photo app, asks a model *what food is in this picture?* The model answers
# through a small [FastAPI](https://fastapi.tiangolo.com/) app (a Python web framework) that wraps
# the Food-11 classifier (MobileNetV2). You learn what a request looks like and what comes back
# (errors included), where the work runs inside the service, why the UI and the model are separate
# services, and how to check what a service serves.
#
# **Where the cells run.** In Docker (the GPU node): in the Jupyter container notebook 2 started.
# On your laptop (`LAB_SERVICES=local`, the default): right here; the notebook starts its services.

# %% [markdown]
# ## The service: one file
#
# The whole service is one FastAPI app, `fastapi_pt/app.py`, read top to bottom; its twin
# `fastapi_onnx/app.py` wraps ONNX Runtime (next notebook). Both import `food11.py`, what they share
# about the *model* (labels, decoding, preprocessing). The next cells print `app.py` part by part.

# %%
from servelab.lab import REPO_ROOT

app_py = (REPO_ROOT / "fastapi_pt" / "app.py").read_text()
parts = app_py.split("\n# ---- ")
print(f"fastapi_pt/app.py: {len(app_py.splitlines())} lines, in {len(parts)} parts:")
for number, part in enumerate(parts[1:], start=2):
    print(f"  {number}. {part.splitlines()[0].rstrip(' -')}")

# %%
print(parts[0])  # 1. what it serves, its imports and its settings

# %% [markdown]
# **Settings** come from environment variables, read once at start-up; a value the service cannot
# use stops it, saying what to set (`docs/settings.md` lists them).

# %%
print("# ---- " + parts[1])  # 2. the plan
print("# ---- " + parts[2])  # 3. the model

# %% [markdown]
# **The plan.** An *inference slot* is a thread that decodes a photo and runs the model on it, one
# request at a time: `PREDICT_CONCURRENCY` slots, `INFERENCE_THREADS` threads per inference. On many
# cores, or beside a GPU, the service runs several processes (uvicorn's *workers*,
# `WEB_CONCURRENCY`): notebook 4 measures why.
#
# **The model.** The *lifespan* (below) loads it once, at start-up, and proves it with one inference
# on its device; where the GPU cannot run it, it runs on the CPU and says why in `/health`.

# %%
print("# ---- " + parts[4])  # 5. the requests and answers (part 4, the metrics, comes back in notebook 4)

# %% [markdown]
# **Request and response.** `POST /predict` takes `{"image": "<JPEG or PNG file, base64-encoded>"}`
# (or `{"url": ...}`: notebook 8) and answers `{"prediction": "<a Food-11 class>", "probability":
# <its softmax probability>}`. *Base64* writes a binary file as text, so it fits in JSON. Both are
# *Pydantic* models (typed classes): FastAPI validates every request against them and publishes
# them as an OpenAPI schema (next notebook).
#
# **Error codes.** A failed request says what went wrong in a `detail` field (`HTTPException`):
#
# | status | when |
# | --- | --- |
# | 422 | the body is not JSON, or has no `image` string (FastAPI's own validation) |
# | 400 | `image` is there, but it is not base64 of an image the service can decode |
# | 413 | the body is larger than `MAX_REQUEST_BYTES` (refused before it is read into memory) |
# | 403, 502, 504 | a photo by URL: a host not allowed, or that failed, or too slow (notebook 8) |
# | 499 | the client left before its answer (notebook 10) |
# | 500 | the model itself failed; the traceback is in the server's log, not in the answer |

# %%
print("# ---- " + parts[5])  # 6. the inference slots
print("# ---- " + parts[8])  # 9. the routes

# %% [markdown]
# ### Where the work runs
#
# The handlers are `async`: they run in the *event loop*, the single thread in which an async server
# runs its coroutines (functions that pause while they wait), one at a time. A blocking call there
# stops all of them, so a handler does no heavy work itself:
#
# 1. A photo sent by URL is downloaded on the event loop (`await fetch(...)`), outside the slots.
# 2. The rest (`classify`: decode, preprocess, run the model) is a job for the slots
#    (`slots.submit`): a free slot takes it; other requests wait in the slots' queue.
# 3. `in_a_slot` waits for the answer, or for the client to leave (notebook 10).
#
# That wait is **queueing delay**, the subject of the rest of the lab: latency is the time a request
# waits plus the time it is served.

# %% [markdown]
# ## Why the UI and the model are separate services
#
# GourmetGram's web app does no inference: it forwards each photo to the model service over HTTP.
# That costs a network hop per prediction, and buys:
#
# - **Separate scaling.** The UI is light and mostly waits; the model is heavy and needs a GPU.
#   Run one small UI and several model servers, not a model in every web server.
# - **Separate optimisation.** Swap PyTorch for ONNX Runtime, or FastAPI for Triton, without
#   touching the UI, as long as the API stays the same.
# - **Isolation.** A model that crashes or restarts does not take the page down: it says "backend
#   unavailable".
#
# GourmetGram's side of it (`gourmetgram/backends.py`): post the upload, base64-encoded, to
# `{FASTAPI_SERVER_URL}/predict`; turn every failure into a readable page.

# %%
backends = (REPO_ROOT / "gourmetgram" / "backends.py").read_text()
start = backends.index("    def predict(", backends.index("class FastAPIBackend"))
print(backends[start : backends.index("\n    def ", start + 1)])

# %% [markdown]
# `FASTAPI_SERVER_URL` is all the UI knows of the model: in the Compose project,
# `http://fastapi_pt:8000` (Compose puts the containers on one network, each reachable by name).
#
# ## Bring the lab's services up
#
# ### In Docker (the GPU node, or any machine with Docker)
#
# Notebook 2 ran this on the node; in the repository clone (rerunning it is harmless):
#
# ```bash
# docker compose up -d --build
# ```
#
# `compose.yaml` holds every service of notebooks 3 to 11, `jupyter` (where these cells run)
# included, on the CPU: the same command on a laptop with Docker. On the node, notebook 2's `.env`
# adds the GPUs and CUDA builds of `docker/compose.gpu.yaml`
# (`COMPOSE_FILE=compose.yaml:docker/compose.gpu.yaml`). `docker compose ps` shows each `healthy`
# once its model is loaded. Ports are published
# on the node's 127.0.0.1 only: `docker compose exec jupyter jupyter server list` prints Jupyter's
# address, which your browser reaches through an SSH tunnel (notebook 2 prints it). A notebook
# cannot run these commands: its container has no access to the host's Docker.
#
# ### On your laptop without Docker
#
# `Lab.connect(...)` uses `make up`'s services if they run, else starts the ones this notebook
# needs, stopped when the kernel exits. In Docker it finds the project's services by name.

# %%
from servelab.lab import Lab

lab = Lab.connect("3_fastapi", triton=False)  # these notebooks use FastAPI only

# %% [markdown]
# Runs are saved under the name passed to `Lab.connect` (`Lab.saved_runs("3_fastapi")` loads them
# back). A local service that crashes is restarted, and a run it interrupted is NOT A CLEAN RUN.
#
# ## Is it up, and what is it serving?
#
# Ask each service for `/health`. Look at `device` (CPU or which GPU),
# `first_inference_ms` (one inference at start-up: the device really runs the model), `runtime`
# (PyTorch or ONNX Runtime) and `weights`. On the node they are the original lab's trained weights;
# elsewhere the model is a seeded, **untrained** MobileNetV2: it costs the same to run, so latency
# and throughput are real, but its labels are meaningless.

# %%
import json

import requests

for flavor, url in lab.fastapi_urls.items():
    health = requests.get(f"{url}/health", timeout=10).json()
    print(f"FastAPI ({flavor}) at {url}/health:")
    print(json.dumps(health, indent=2))
    if health["weights"] != "trained":
        rule = "!" * 78
        print(
            f"\n{rule}\n!! WEIGHTS: {health['weights'].upper()}. Latency and throughput are real; "
            f"predicted labels are NOT.\n!! {health['weights_note']}\n{rule}\n"
        )

# %% [markdown]
# ## The error paths, for real
#
# Each request below is wrong in a different way. The 413 case sends a body just over the
# service's own limit, read from `/health`.

# %%
service_url = next(iter(lab.fastapi_urls.values()))
limit = requests.get(f"{service_url}/health", timeout=10).json()["max_request_bytes"]
bad_requests = {
    "no 'image' field": {"json": {"picture": "abc"}},
    "not JSON at all": {"data": b"hello", "headers": {"Content-Type": "application/json"}},
    "base64 of text, not an image": {"json": {"image": "aGVsbG8gd29ybGQ="}},
    "body over the size limit": {"json": {"image": "A" * (limit + 1)}},
}
for what, request_kwargs in bad_requests.items():
    response = requests.post(f"{service_url}/predict", timeout=30, **request_kwargs)
    detail = response.json()["detail"]
    shown = detail if isinstance(detail, str) else json.dumps(detail)[:160]
    print(f"{what:30s} -> HTTP {response.status_code}: {shown}")

# %% [markdown]
# Every failure gets a status code the caller can act on (4xx: fix your request), never a 200 with
# an error hidden in the body.
#
# ## Your turn: change a setting
#
# **Your turn.** The service reads its settings from environment variables at start-up (part 1 of
# `app.py`; `docs/settings.md` lists them). Edit `MAX_REQUEST_BYTES` and run the cell: a private ONNX
# service starts with your value and is sent the sample photo. Try a limit below the photo's size,
# one above it, and one that is not a number.

# %%
import base64

from servelab.lab import StackError

# Your turn: MAX_REQUEST_BYTES = "...", the service's limit on a request's size in bytes, as text (the
#   environment's way): below the photo's size, above it, or not a number (docs/settings.md).
### BEGIN SOLUTION
MAX_REQUEST_BYTES = "20000"
### END SOLUTION
photo_body = json.dumps({"image": base64.b64encode(lab.sample_image()).decode()})
try:
    with lab.measurer.fastapi_variant("onnx", MAX_REQUEST_BYTES=MAX_REQUEST_BYTES) as variant_url:
        told = requests.get(f"{variant_url}/health", timeout=10).json()["max_request_bytes"]
        answer = requests.post(
            f"{variant_url}/predict", data=photo_body, timeout=30, headers={"Content-Type": "application/json"}
        )
        print(
            f"/health: max_request_bytes {told}; the sample photo, {len(photo_body)} bytes as JSON -> "
            f"HTTP {answer.status_code}"
        )
except StackError as refused:
    print(f"The service did not start:\n{refused}")

# %% [markdown]
# ## Questions
#
# 1. Why is a malformed request refused with a 4xx code, not answered 200 with an error inside?
#    What does each code tell a client to do?
# 2. Which `/health` field shows that the model really runs on the device it names, and why is
#    `device` alone not enough?
#
# **Hand in:** the `/health` output, the error paths' table, and your setting's three outcomes.
#
# Next, `4_fastapi_bench.ipynb` measures how fast the service answers one user, then sixteen. In
# Docker, leave the project running; locally, the next cell stops this notebook's services.

# %%
lab.stop()
