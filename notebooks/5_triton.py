# %% [markdown]
# # 5. Serving the model with Triton Inference Server
#
# **Time:** about 11 minutes (10 reading, 1 running, 0 hands-on; `python -m servelab.time_plan`)
#
# FastAPI gave us a service with a fixed number of inference slots, each running one request at
# a time. When more requests arrive than there are slots, each waits in line behind the others:
# that waiting, the *queueing delay*, is what made the FastAPI latencies grow with concurrency,
# even though the model itself did not get any slower.
#
# [NVIDIA Triton Inference Server](https://github.com/triton-inference-server/server) is a
# server built for exactly this problem. It can run several copies ("instances") of a model
# side by side, merge waiting requests into batches, and serve models through fast,
# specialized backends (ONNX Runtime, TensorRT, PyTorch...) as well as plain Python.
#
# In this notebook we
#
# 1. bring up Triton with our food classifier (and the GourmetGram web UI in front of it),
# 2. take apart a Triton *model repository*: the folder layout, `config.pbtxt`, and the
#    `model.py` of a Python-backend model,
# 3. look at what the running server says it serves, and
# 4. classify a photo through the web UI, which now talks to Triton.
#
# The benchmarks come in the next notebook, `6_triton_bench.ipynb`.
#
# **Where things run.** In Docker (the GPU node, or any machine with Docker), the Python cells
# run in the Jupyter container of the lab's Compose project, next to its `triton` service, and the
# shell commands below on the Docker host (on the node, in your SSH session). On your own machine
# without Docker, every cell runs locally: the notebook starts its own Triton server, CPU only,
# on 127.0.0.1.

# %% [markdown]
# ## Bring up Triton
#
# **In Docker**, Triton is already up: the Compose project of notebook 3 runs it beside FastAPI
# (`triton`, with the NVIDIA image 24.12 and PyTorch added for the Python backend). Its first
# build downloads a large image and installs PyTorch into it, which takes many minutes. Follow
# the server as it loads the models, on the Docker host, in the repository clone:
#
# ```bash
# # runs on the Docker host (the node)
# docker compose logs -f triton
# ```
#
# Wait for a table that lists `food_classifier` and `food_classifier_onnx` as `READY`, and for
# `Started HTTPService at 0.0.0.0:8000`; then Ctrl-C stops following the log (the server keeps
# running). `Lab.connect(...)` below waits until Triton answers.
#
# **On your own machine**, there is nothing to start by hand: `Lab.connect(...)` uses a stack
# already started with `make up`, or starts a private one for this notebook (FastAPI and Triton)
# and stops it when the notebook's kernel shuts down.

# %%
# runs in the Jupyter container (Docker) or on your machine (local)
import base64
import json
from pathlib import Path

import numpy as np
import requests
import tritonclient.http as triton_http

from servelab import paths
from servelab.lab import Lab
from servelab.triton.config import TritonConfig

lab = Lab.connect("5_triton")
triton = triton_http.InferenceServerClient(lab.triton_http)

# %% [markdown]
# ## Anatomy of a Triton model repository
#
# Triton serves the models it finds in a *model repository*: a folder with one sub-folder per
# model. Each model folder holds a `config.pbtxt` that describes the model, and one numbered
# sub-folder per model version (we have only version `1`) with the model's files.
#
# Our repository is `models_staging/` in the lab's repository, as written for the GPU node, without
# the model files, which are built. Triton serves a staged copy of it, with the model files: in
# Docker the Triton container's start copies `models_staging/` (mounted as `/models`) into a volume
# this notebook's container shares, with the model files of its image; `make up` stages it the same
# way. Here is our first model, `food_classifier`, as Triton serves it: it runs the PyTorch
# MobileNetV2 inside Triton's **Python backend**:


# %%
def show_tree(folder: Path) -> None:
    """Print a folder the way the `tree` command does, with each file's size."""
    print(f"{folder.name}/")

    def walk(directory: Path, indent: str) -> None:
        entries = sorted(entry for entry in directory.iterdir() if entry.name != "__pycache__")
        for position, entry in enumerate(entries):
            last = position == len(entries) - 1
            branch = "└── " if last else "├── "
            if entry.is_dir():
                print(f"{indent}{branch}{entry.name}/")
                walk(entry, indent + ("    " if last else "│   "))
            else:
                print(f"{indent}{branch}{entry.name} ({entry.stat().st_size / 1024:,.1f} KiB)")

    walk(folder, "")


show_tree(lab.repository / "food_classifier")

# %% [markdown]
# - `config.pbtxt`: what the model is called, which backend runs it, its inputs and outputs,
#   how large a batch it accepts, and how many instances of it to run, where.
# - `1/model.py`: the Python backend's entry point, the code that runs for each request.
# - `1/food11.pth`: the MobileNetV2 weights that `model.py` loads.
# - `1/food11.pth.weights.json`: a record of whether those weights are trained (see the
#   README: without a downloadable checkpoint, the lab builds an *untrained* model, so its
#   timing is real but its labels are not meaningful).
#
# The last two are not committed to git: staging puts them there (locally those `make artifacts`
# built, in Docker those of the Triton image). The lab's labels,
# image decoding and preprocessing that `model.py` imports are not copied here: they are the lab's
# service package (`servelab.service.food11`), installed where the server runs, as in every service.
#
# ### `config.pbtxt`
#
# The configuration is written in protobuf's text format:

# %%
print(lab.triton.config("food_classifier"))

# %% [markdown]
# What each part means:
#
# - **`backend: "python"`**: Triton starts a separate Python process (a "stub") for each model
#   instance and calls `model.py` in it.
# - **`max_batch_size: 16`**: the model accepts a leading batch dimension, up to 16 images per
#   execution. Because of it, the `dims` below leave the batch dimension out: an input with
#   `dims: [ 1 ]` really has shape `[batch, 1]`. A client can send up to 16 images in one
#   request; with dynamic batching (next notebook) Triton can also merge several requests into
#   one execution, still up to 16 images in total.
# - **`input`**: one tensor, `INPUT_IMAGE`, of type `TYPE_STRING`: each element is a byte
#   string, here an image file encoded in base64. (On the wire, Triton's HTTP/gRPC protocol
#   calls this type `BYTES`.) The model does its own decoding and preprocessing.
# - **`output`**: two tensors per image: `FOOD_LABEL` (a string such as `"Soup"`) and
#   `PROBABILITY` (a 32-bit float).
# - **`instance_group`**: how many copies of the model to run, and on what. `count: 1`,
#   `kind: KIND_GPU`, `gpus: [ 0 ]` asks for one instance on GPU 0. For a GPU group, `count` is
#   the number of instances *on each GPU listed*. With `kind: KIND_CPU` (and no `gpus`), the
#   instances run on the CPU. Each instance handles one execution at a time; requests that
#   arrive while every instance is busy wait in Triton's queue.
#
# ### `model.py`
#
# A Python-backend model is a class named `TritonPythonModel`. Triton calls its `initialize`
# once per instance when the model loads, and its `execute` for every batch of work:

# %%
print((paths.MODELS_STAGING_DIR / "food_classifier" / "1" / "model.py").read_text())

# %% [markdown]
# - **`initialize(args)`** learns from `args` which kind of instance it is (`GPU` or `CPU`, and
#   which GPU), loads the weights onto that device once, and keeps the model in memory for all
#   later requests.
# - **`execute(requests)`** receives a *list* of requests. Without dynamic batching, Triton
#   hands each instance one request at a time, so the list has one element (which may itself
#   carry up to 16 images if the client batched them). With dynamic batching on, Triton puts
#   every request it has gathered into the list. Either way, `execute` decodes and preprocesses
#   every image of every request, stacks them into one tensor, runs **one** forward pass on the
#   whole stack, and then slices the output back into one response per request, in the same
#   order. A request whose image cannot be decoded gets an error response of its own without
#   failing its neighbours.
#
# Running the network once on a stack of images is what makes batching pay on a GPU: the GPU
# works on all the images in parallel, so a batch of 8 costs little more time than a batch of 1.
#
# ### The ONNX model
#
# Our second model, `food_classifier_onnx`, serves the same network exported to ONNX through
# Triton's **ONNX Runtime backend**. It has no `model.py` at all: Triton runs `model.onnx`
# directly. (A Triton server without that backend, as the lab's local one from a pip wheel, gets a
# `model.py` from the staging, which runs the graph with ONNX Runtime in the Python backend: the
# tree below shows which this server got.)

# %%
show_tree(lab.repository / "food_classifier_onnx")
print()
print(lab.triton.config("food_classifier_onnx"))

# %% [markdown]
# The input is no longer an image file but the preprocessed tensor itself: 32-bit floats of
# shape `[3, 224, 224]` (plus the batch dimension), named `input` as in the ONNX graph. The
# output is the network's 11 raw scores, `output`. Decoding, resizing, normalizing, softmax and
# picking the label all move to the *client*. The input and output names and shapes must match
# the ONNX graph exactly, since Triton feeds the tensors to it unchanged.
#
# ## Explicit model control: changing a model without restarting the server
#
# By default Triton loads every model in its repository at start-up and never looks again. Our
# server runs with `--model-control-mode=explicit` instead: a model is loaded (or unloaded)
# only when a client asks, through the model repository API
# (`POST /v2/repository/models/<name>/load`). Asking to load a model that is already loaded
# *reloads* it from disk: Triton reads its `config.pbtxt` again and brings up the new instances
# before retiring the old ones, while every other model keeps serving.
#
# That is how the next notebook changes a model's configuration: it edits `config.pbtxt` in
# the repository and reloads just that model. (The original version of this lab rebuilt and
# restarted the whole Triton container for each change.)
#
# The repository index shows each model Triton knows about and its state:

# %%
for entry in triton.get_model_repository_index():
    print(f"{entry['name']:<22} version {entry.get('version', '-'):<3} {entry.get('state', 'not loaded')}")

# %% [markdown]
# ## What the running server actually serves
#
# `config.pbtxt` is what we *asked* for. Triton's model configuration endpoint
# (`GET /v2/models/<name>/config`) reports what it is *actually* running, with all its own
# defaults filled in. That is worth checking, because it can differ from the file.
#
# Every Triton of the lab serves a copy of the repository staged for the server it runs on, and
# the lab does not hide the difference. Both configs carry a `weights` parameter saying whether the
# weights are trained. Where the server has no GPU (your own machine, or Docker's CPU variant),
# every `KIND_GPU` instance group becomes `KIND_CPU`. Where it has no ONNX Runtime backend (the
# local stack runs Triton 2.51 from a pip package, which has only the Python backend),
# `food_classifier_onnx` is served by a Python-backend model that runs the same `model.onnx` with
# ONNX Runtime on the CPU, and its config carries a `served_by` parameter that says so. Locally,
# each staged `model.py` also starts with one added line that puts the lab's virtualenv on
# `sys.path`, because the pip-installed Triton runs `model.py` in an interpreter that ignores
# `PYTHONPATH`. On the GPU node's image, the configs are served as written: `KIND_GPU` and the
# real `onnxruntime` backend.


# %%
def describe_served(model: str) -> None:
    """What Triton reports for `model`, beside what its config.pbtxt asked for."""
    served = lab.triton.served_config(model)
    print(f"{model}")
    asked = lab.models.get(model).backend
    print(f"  backend:        config.pbtxt asks for {asked!r}; Triton runs {served.get('backend')!r}")
    print(f"  max_batch_size: {served.get('max_batch_size')}")
    for group in served.get("instance_group", []):
        gpus = f" on GPUs {group['gpus']}" if group.get("gpus") else ""
        print(f"  instance group: {group['count']} x {group['kind']}{gpus}")
    print(f"  dynamic batching: {'on' if 'dynamic_batching' in served else 'off'}")
    if "sequence_batching" in served:  # a stateful model (notebook 10): each request is a frame of a sequence
        strategy = "direct" if "direct" in served["sequence_batching"] else "oldest"
        print(f"  sequence batching: on, strategy {strategy}")
    # weights_note is a long explanation of the weights parameter; GourmetGram shows it below.
    for key, value in served.get("parameters", {}).items():
        if key != "weights_note":
            print(f"  parameter {key}: {value.get('string_value')}")


for model in lab.models.names():
    describe_served(model)
    print()

# %% [markdown]
# You can also compare the file the server loads with the one in `models_staging/`, line by line
# (on the GPU node only the weights parameters differ):

# %%
for model in lab.models.names():
    served = TritonConfig.read(lab.repository / model / "config.pbtxt", f"{lab.repository / model}/config.pbtxt")
    changes = lab.triton.config(model).diff(served, after=f"{served.origin} (what Triton loads)")
    print(changes or f"{model}: Triton loads models_staging/{model}/config.pbtxt unchanged.\n")

# %% [markdown]
# ## One request to Triton, by hand
#
# Before putting the web UI in front of it, here is the request GourmetGram sends to the
# Python-backend model, made with Triton's own client library: one image, base64-encoded, in a
# `[1, 1]` tensor of type `BYTES` (a batch of one, with one string in it).

# %%
image_input = triton_http.InferInput("INPUT_IMAGE", [1, 1], "BYTES")
image_input.set_data_from_numpy(np.array([[base64.b64encode(lab.sample_image()).decode()]], dtype=object))
answer = triton.infer(
    "food_classifier",
    [image_input],
    outputs=[triton_http.InferRequestedOutput("FOOD_LABEL"), triton_http.InferRequestedOutput("PROBABILITY")],
)
label = answer.as_numpy("FOOD_LABEL")[0, 0].decode()
probability = float(answer.as_numpy("PROBABILITY")[0, 0])
parameters = lab.triton.served_config("food_classifier").get("parameters", {})
weights = parameters.get("weights", {}).get("string_value", "unknown")
print(f"food_classifier says: {label} (probability {probability:.3f}); weights: {weights}")

# %% [markdown]
# If the weights are `untrained`, the label is arbitrary: only the timing of this model means
# anything. With a trained checkpoint (see the README) the label is the real prediction.
#
# ## The web UI, now in front of Triton
#
# GourmetGram has not changed: it still takes a photo upload, but now it forwards the image to
# Triton's `food_classifier` model instead of to FastAPI.
#
# The next cell starts a GourmetGram in front of `food_classifier` where this notebook runs, and
# does what your browser does: it uploads a photo to `/predict` as an HTTP multipart form, and
# reads the label from the page that comes back. Locally, open its address in a browser on this
# machine while the notebook's kernel is running. In Docker, your browser has the Compose
# project's `gourmetgram` service (port 8300, through your SSH tunnel on the node); put it in front
# of Triton on the Docker host with
# `GOURMETGRAM_TRITON_URL=triton:8000 FOOD11_MODEL_NAME=food_classifier docker compose up -d gourmetgram`.

# %%
ui_url = lab.ui("food_classifier")
print(f"GourmetGram: {ui_url}")
print("It reports:", json.dumps(requests.get(f"{ui_url}/healthz", timeout=10).json(), indent=1))
lab.upload_to_ui(ui_url, "soup.jpg", lab.sample_image())

# %% [markdown]
# The page's header names the backend and the model it used (`triton`, model `food_classifier`),
# and its last line says what the model takes (an image file): GourmetGram sent the file's bytes
# and Triton's `model.py` did the decoding, preprocessing and inference.
#
# ## Questions
#
# 1. Triton's configuration endpoint reports what it really runs. What differed from
#    `config.pbtxt` here, and why does that matter when you compare your runs with another's?
# 2. GourmetGram sent Triton the photo's bytes. Where did decoding and preprocessing happen, and
#    what does that cost the model's instance?
#
# **Hand in:** the served config's printout, your request's answer, and the GourmetGram page.
#
# ## Wrapping up
#
# In Docker, Triton stays up for the next notebook, `6_triton_bench.ipynb`, where we measure
# it: queueing under concurrency, more model instances, the ONNX Runtime backend, bursty
# arrivals and dynamic batching.
#
# Locally, the services this notebook started stop with its kernel; the next cell stops them
# right away, to free the CPU for the benchmarks (in Docker it does nothing: the containers keep
# running).

# %%
lab.stop()
