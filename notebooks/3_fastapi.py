# %% [markdown]
# # 3. Wrapping the model in FastAPI
#
# **Time:** about 13 minutes (10 reading, 0 running, 3 hands-on; `python -m servelab.time_plan`)
#
# GourmetGram, our food photo app, needs a model behind it that answers one question: *what food
# is in this picture?* In this notebook you meet the service that answers it: a small
# [FastAPI](https://fastapi.tiangolo.com/) app that wraps the Food-11 classifier (MobileNetV2) and
# answers HTTP requests. By the end you should be able to say:
#
# - what a request to the model service looks like, and what comes back (including the errors);
# - where inside the service the work happens, and which part of it is allowed to run in parallel;
# - why the web UI and the model service are two separate processes;
# - how to bring the FastAPI stack up, and how to check that it serves the model you think it does.
#
# **Where the cells run.** On the GPU node (or any machine with Docker), the code cells run *in the
# Jupyter container of the lab's Compose project*
# (it has the repository mounted and can reach the services by their Docker names). Notebook 2
# started that container and printed its address: open this notebook there and run it from the top.
# The section "Bring the FastAPI stack up" below shows the commands it ran, for when you start the
# stack yourself. On your laptop (`LAB_SERVICES=local`, the default) every cell runs right here, and the notebook
# starts the services it needs itself.

# %% [markdown]
# ## The service, file by file
#
# Two files make up the PyTorch service:
#
# - `fastapi_pt/app.py` loads the model and says how to run it on a batch of images. That is all
#   it does. Its twin, `fastapi_onnx/app.py`, does the same with ONNX Runtime, and you will switch
#   to it in the next notebook.
# - `servelab/service/predict_api.py` is the HTTP side that both apps share: the request and response
#   schemas, the error codes, the size limit, and where decoding and inference run. It is part of
#   the lab's service package, `servelab/service/`, which every service installs: locally in the
#   lab's virtualenv, and in every Docker image, built from the repository root.
#
# The next cell prints the first file as it is on disk.

# %%
from servelab import paths

print((paths.FASTAPI_PT_DIR / "app.py").read_text())

# %% [markdown]
# Notice what is *not* in there: no routes, no JSON, no error handling. `run_model` takes a NumPy
# batch of shape `[N, 3, 224, 224]` and returns logits `[N, 11]`; the device (GPU when PyTorch sees
# one, CPU otherwise) is chosen once at start-up. Everything about HTTP lives in the shared file,
# `servelab/service/predict_api.py`. Most of it is plumbing you can read later (settings from the
# environment, the size limit, metrics, what happens when a client hangs up). The next cell prints
# the four parts that matter here, found by name in the file as it is on disk: the request and
# response schemas, the `/predict` route, and `compute`, which decides where a request's work runs.

# %%
from servelab.lab.source_excerpts import excerpt

predict_api = paths.SERVICE_PACKAGE_DIR / "predict_api.py"
print(f"# {len(predict_api.read_text().splitlines())} lines in all; the parts that matter here:\n")
print(excerpt(predict_api, "PredictRequest", "PredictResponse", "create_app.predict", "create_app.compute"))

# %% [markdown]
# ### What to take from it
#
# **Request and response.** `POST /predict` takes a JSON body with one field,
# `{"image": "<the JPEG or PNG file, base64-encoded>"}` (or, instead, `{"url": ...}`: where to fetch
# the photo, which notebook 7 uses), and answers
# `{"prediction": "<one of the 11 Food-11 classes>", "probability": <its softmax probability>}`.
# Base64 turns the binary file into text, so it fits in JSON, at the price of a body about a third
# larger than the file. Both shapes are Pydantic models (`PredictRequest`, `PredictResponse`), so
# FastAPI validates every request against them and publishes them in an OpenAPI schema, which the
# next notebook reads.
#
# **Error codes.** A failed request says what went wrong, and what to do about it, in a `detail`
# field:
#
# | status | when |
# | --- | --- |
# | 422 | the body is not JSON, or has no `image` string (FastAPI's own validation) |
# | 400 | `image` is there, but it is not base64 of an image the service can decode |
# | 413 | the body is larger than `MAX_REQUEST_BYTES` (refused before it is read into memory) |
# | 500 | the model itself failed; the traceback is in the server's log, not in the answer |
#
# **Where the work runs.** The handler is `async`, so one event loop accepts every connection. It
# never does heavy work itself:
#
# 1. Base64 and image decoding and the preprocessing (resize, crop, normalise) run in the
#    *preprocessing pool*, a thread pool with `PREPROCESS_WORKERS` threads (by default one per two
#    slots on a CPU, where the cores are for the model, and one per core on a GPU node, where
#    decoding is the CPU's main work). A request is decoded while the model is busy with another, but at most
#    `DECODE_AHEAD` requests ahead of it (two per slot by default): the rest wait undecoded, so
#    memory stays bounded however many clients send.
# 2. The model call waits for one of `PREDICT_CONCURRENCY` *inference slots* (by default one per
#    CPU core, one on a GPU), then runs in a thread of its own. With one slot, the model sees one
#    image at a time. Every other request waits in line for a slot.
#
# On a machine with many cores, or beside a GPU, the service runs several such processes
# (`processes` in `/health`), each with its own slots, on its share of the cores: notebook 4 says why.
#
# That wait in line is **queueing delay**, and it is the subject of the rest of the lab: a request's
# latency is the time it waits plus the time it is served. With one sender there is nobody to wait
# behind. With many, the wait can be far longer than the inference itself.
#
# `/health` reports the service's settings, and whether its weights are trained, so you never have
# to guess what a service is running.

# %% [markdown]
# ## Why the UI and the model are separate services
#
# An earlier version of GourmetGram loaded the model inside the Flask web app. Here the web app does
# no inference at all: it forwards each uploaded photo to the model service over HTTP. Splitting
# them costs one extra network hop per prediction, and buys a lot:
#
# - **Scale them separately.** The web UI is light and mostly waits; the model is heavy and needs a
#   GPU. With two services you can run one small UI and several model servers (or one model
#   server on a big GPU), instead of copying the model into every web server.
# - **Optimise them separately.** You can swap PyTorch for ONNX Runtime, or FastAPI for Triton
#   (later in this lab), without touching one line of the UI, as long as the API stays the same.
# - **Isolate them.** A model that crashes, or is restarting with new weights, does not take the
#   web page down with it. The page says "backend unavailable" instead.
#
# Here is the whole of GourmetGram's side of the conversation, taken from `gourmetgram/backends.py`: it
# base64-encodes the uploaded file, posts it to `{FASTAPI_SERVER_URL}/predict`, and turns every
# failure into a page the user can read.

# %%
print(excerpt(paths.GOURMETGRAM_DIR / "backends.py", "FastAPIBackend.predict"))

# %% [markdown]
# The UI learns where the model lives from one environment variable, `FASTAPI_SERVER_URL`. In the
# Docker Compose project it is `http://fastapi_pt:8000`: Compose puts the containers on one
# network where each service is reachable by its name.
#
# ## Bring the lab's services up
#
# ### In Docker: the GPU node, or any machine with Docker (in your SSH session on the node)
#
# Notebook 2 already did this for you on the node; here is what it ran, so you can do it yourself
# (running it again is harmless: Compose only starts what is not running yet). The images build the
# model files themselves, in one of them (`torch`), from the weights `FOOD11_CHECKPOINT` names:
#
# ```bash
# # runs on the node, in the repository clone (~/serve-system)
# docker compose up -d --build
# # on a machine without an NVIDIA GPU (a laptop with Docker), the CPU variant instead:
# # docker compose -f compose.yaml -f docker/compose.cpu.yaml up -d --build
# ```
#
# This builds and starts one project (`compose.yaml`) with every service of notebooks 3 to 10:
# `fastapi_pt` (the model service above), `fastapi_onnx` (the same with ONNX Runtime, next
# notebook), `triton`, `ray_serve`, `image_host`, `gourmetgram` (the web UI, talking to
# `http://fastapi_pt:8000`) and `jupyter`, a Jupyter server with the repository mounted at `work/`:
# this is where the code cells of notebooks 3 to 10 run. Each port is published on the node's
# 127.0.0.1 only, at the numbers of the README's table (Jupyter 8888, GourmetGram 8300, FastAPI
# 8100 and 8101...).
#
# `docker compose ps` shows them; each reports `healthy` once its model is loaded. Jupyter is
# protected by a random token. Ask the container for it:
#
# ```bash
# # runs on the node
# docker compose exec jupyter jupyter server list
# ```
#
# It prints a line like `http://127.0.0.1:8888/?token=0123abcd...`. Your browser reaches the
# node's 127.0.0.1 through an SSH tunnel: on your own machine, run
# `ssh -L 8888:127.0.0.1:8888 -L 8300:127.0.0.1:8300 -L 8100:127.0.0.1:8100 cc@A.B.C.D` (your
# node's floating IP in place of `A.B.C.D`), paste the address into your browser, then open
# `work/notebooks/3_fastapi.ipynb` and run it from the top.
#
# The notebook cannot run these commands for you: it runs *inside* one of those containers, and
# the container has no access to Docker on the host.
#
# ### On your laptop without Docker (local services)
#
# `Lab.connect(...)` uses the lab if `make up` is already running it, and otherwise starts the
# services this notebook needs (FastAPI with PyTorch and with ONNX Runtime; Triton comes in
# notebook 5) as local processes, and stops them when the notebook's kernel exits. In the Jupyter
# container the same line finds the Compose project's services by name, and waits until they answer.

# %%
from servelab.lab import Lab

lab = Lab.connect("3_fastapi", triton=False)  # these notebooks use FastAPI only

# %% [markdown]
# The name passed to `Lab.connect` names the file every run of this notebook is saved to as it
# ends (the line above says where). If the kernel dies or you come back another day,
# `Lab.saved_runs("3_fastapi")` loads them back. If a local service crashes, the lab restarts it,
# the notebook says so, and a run the crash interrupted is marked NOT A CLEAN RUN.
#
# ## Is it up, and what is it serving?
#
# Ask each FastAPI service for `/health`. Look at four fields in particular: `device` (CPU or
# which GPU), `first_inference_ms` (the service ran one inference there as it started: the device
# really runs the model), `runtime` (PyTorch or ONNX Runtime), and `weights`. On the node the
# model files are built from the original lab's trained weights (notebook 2); elsewhere, with no
# internet to fetch them, the model is a seeded, **untrained** MobileNetV2. It costs exactly as
# much to run as a trained one, so every latency and throughput you measure is real, but the
# labels it predicts are then meaningless.

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
# The table of error codes above is a promise; here the service keeps it. Each request below is
# wrong in a different way. The 413 case sends a body just over the service's own limit, read from
# `/health`, so nothing is guessed.

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
# Every failure is refused with a status code the caller can act on (4xx: fix your request), never
# with a 200 that hides an error message in the body.
#
# ## Your turn: change a setting
#
# **Your turn.** The service reads its settings from environment variables as it starts (the
# table at the top of `servelab/service/settings.py`). Edit `MAX_REQUEST_BYTES` below and run the
# cell: a private copy of the ONNX service starts with your value, its `/health` reports it, and
# the sample photo is sent. Try a limit below the photo's size (it is refused with 413), one above
# it (answered), and one that is not a number (the service refuses to start, and says why).

# %%
import base64

from servelab.stack.supervision import StackError

MAX_REQUEST_BYTES = "20000"  # edit me
photo_body = json.dumps({"image": base64.b64encode(lab.sample_image()).decode()})
try:
    with lab.fastapi_variant("onnx", MAX_REQUEST_BYTES=MAX_REQUEST_BYTES) as variant_url:
        told = requests.get(f"{variant_url}/health", timeout=10).json()["max_request_bytes"]
        answer = requests.post(f"{variant_url}/predict", data=photo_body, timeout=30,
                               headers={"Content-Type": "application/json"})  # fmt: skip
        print(f"/health: max_request_bytes {told}; the sample photo, {len(photo_body)} bytes as JSON -> "
              f"HTTP {answer.status_code}")  # fmt: skip
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
# Next, in `4_fastapi_bench.ipynb`, you send real predictions, through the API and through the web
# UI, and measure how fast the service answers one user, then sixteen. In Docker, leave the project
# running. Locally, the next cell stops the services this notebook started; the next notebook starts
# its own.

# %%
lab.stop()
