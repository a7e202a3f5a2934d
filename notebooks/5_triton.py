# %% [markdown]
# # 5. Serving the model with Triton Inference Server
#
# In FastAPI, requests beyond its inference slots waited in line: that *queueing delay*, not a
# slower model, made latency grow with concurrency.
#
# [NVIDIA Triton Inference Server](https://github.com/triton-inference-server/server) is built for
# this. It runs several copies of a model side by side (*instances*), merges waiting requests into
# one batch (*dynamic batching*), and runs each model through a *backend*, the plug-in for one kind
# of model (ONNX Runtime, TensorRT, PyTorch, plain Python).
#
# This notebook brings up Triton with our food classifier, takes apart its *model repository*
# (folders, `config.pbtxt`, a Python-backend `model.py`), reads what the server says it serves,
# changes it, and classifies a photo through GourmetGram in front of Triton.
#
# **Where things run.** In Docker, Python cells run in the Compose project's Jupyter container and
# shell commands on the Docker host (on the node, your SSH session); without Docker, all on your
# machine, with a CPU-only Triton.

# %% [markdown]
# ## Bring up Triton
#
# **In Docker**, the Compose project runs Triton (NVIDIA's image, plus PyTorch for the Python
# backend); on the node its image builds from notebook 2 on, and `Lab.connect(...)` below waits
# for it. On the Docker host, in the repository clone, watch Triton load the models:
#
# ```bash
# docker compose logs -f triton
# ```
#
# until it lists both models as `READY` and says `Started HTTPService`; Ctrl-C stops following,
# not Triton.
#
# **Locally**, `Lab.connect(...)` uses a stack started with `make up`, or starts a private one that
# stops with the kernel.

# %%
# runs in the Jupyter container (Docker) or on your machine (local)
import base64
import json

import numpy as np
import requests
import tritonclient.http as triton_http
from tritonclient.utils import InferenceServerException

from servelab.lab import REPO_ROOT, Lab
from servelab.lessons import triton_intro

MODELS_STAGING = REPO_ROOT / "models_staging"  # the model folders as shipped
lab = Lab.connect("5_triton")
# Triton's own client. Loading a model can take a minute on a busy CPU, hence the long timeout.
triton = triton_http.InferenceServerClient(lab.triton_http, network_timeout=600)

# %% [markdown]
# ## Anatomy of a model repository
#
# A *model repository* is the folder Triton serves models from: per model, a `config.pbtxt` (its
# description) and one numbered folder per version with the model's files.
#
# Ours is `models_staging/`, committed without the built model files. Triton serves a *staged* copy,
# with those files added. Here is `food_classifier`, the PyTorch MobileNetV2 in Triton's **Python
# backend**:

# %%
print(triton_intro.tree(lab.repository / "food_classifier"))

# %% [markdown]
# - `config.pbtxt`: name, backend, inputs and outputs, largest batch, instances.
# - `1/model.py`: the code the Python backend runs for each request.
# - `1/food11.pth`: the weights `model.py` loads (built, not committed).
# - `1/food11.pth.weights.json`: whether they are trained. An *untrained* model's timing is real,
#   its labels are not.
#
# Decoding, preprocessing and labels come from `food11.py`, the model module at the top of the repository.
#
# ### `config.pbtxt`
#
# In protobuf's text format (`field: value`, `[ ]` lists, `{ }` blocks):

# %%
print((MODELS_STAGING / "food_classifier" / "config.pbtxt").read_text())

# %% [markdown]
# - **`backend: "python"`**: each instance runs `model.py` in its own Python process (a *stub*).
# - **`max_batch_size`**: the largest batch per execution. The batch dimension is implicit:
#   `dims: [ 1 ]` means shape `[batch, 1]`. A client may send a batch in one request; dynamic
#   batching (notebook 7) also merges requests, within this limit.
# - **`input`**: `INPUT_IMAGE`, `TYPE_STRING` (`BYTES` on the wire): a base64-encoded image file,
#   which the model decodes and preprocesses itself.
# - **`output`**: per image, `FOOD_LABEL` (e.g. `"Soup"`) and `PROBABILITY` (a float).
# - **`instance_group`**: how many instances, on what. `KIND_GPU` runs `count` instances *on each
#   GPU listed*; `KIND_CPU`, on the CPU. An instance runs one execution at a time; requests that
#   find every instance busy wait in Triton's queue.
#
# ### `model.py`
#
# A Python-backend model is a class, `TritonPythonModel`:

# %%
print((MODELS_STAGING / "food_classifier" / "1" / "model.py").read_text())

# %% [markdown]
# - **`initialize(args)`**, once per instance at load: loads the weights onto the instance's device
#   (GPU or CPU, named in `args`) and keeps the model in memory.
# - **`execute(requests)`**, per batch of work: gets a *list* of requests (one without dynamic
#   batching), stacks all their images into one tensor, runs **one** forward pass, and slices the
#   output into one response per request, in order.
#
# One pass over a stack is why batching pays on a GPU: the images run in parallel.
#
# ### The ONNX model
#
# `food_classifier_onnx` is the same network exported to ONNX, run by Triton's **ONNX Runtime
# backend** straight from `model.onnx`. (The local pip Triton lacks that backend: there a `model.py`
# runs ONNX Runtime in the Python backend, as the tree shows.)

# %%
print(triton_intro.tree(lab.repository / "food_classifier_onnx"))
print()
print((MODELS_STAGING / "food_classifier_onnx" / "config.pbtxt").read_text())

# %% [markdown]
# Its input is the preprocessed tensor, and its output the network's raw scores: decoding,
# resizing, normalizing, softmax and choosing the label move to the *client*. Names and shapes must
# match the ONNX graph exactly.
#
# ## Explicit model control: changing a model without a restart
#
# Our Triton runs with `--model-control-mode=explicit`: a model is loaded only when a client asks,
# through the *model repository API* (`POST /v2/repository/models/<name>/load`). Loading a loaded
# model *reloads* it: Triton rereads its `config.pbtxt` and starts the new instances before
# retiring the old, while other models keep serving. The repository index lists each model and its
# state:

# %%
for entry in triton.get_model_repository_index():
    print(f"{entry['name']:<22} version {entry.get('version', '-'):<3} {entry.get('state', 'not loaded')}")

# %% [markdown]
# ## What the running server actually serves
#
# `config.pbtxt` is what we *asked* for; `GET /v2/models/<name>/config` reports what Triton *runs*,
# defaults filled in. The staged copy is adapted to the machine:
#
# - every config gets a `weights` parameter (trained or not);
# - without a GPU, `KIND_GPU` becomes `KIND_CPU`;
# - without the ONNX Runtime backend (the local pip Triton), `food_classifier_onnx` runs in the
#   Python backend, and a `served_by` parameter says so;
# - locally, each `model.py` gets a line putting the lab's virtualenv on `sys.path`.
#
# On the GPU node, the configs are served as written.

# %%
for model in ("food_classifier", "food_classifier_onnx"):
    served = triton.get_model_config(model)  # GET /v2/models/<name>/config
    print(triton_intro.describe_served(MODELS_STAGING / model, served))
    print()

# %% [markdown]
# The file Triton loads, line by line against the one in `models_staging/`:

# %%
for model in ("food_classifier", "food_classifier_onnx"):
    print(triton_intro.changes_on_load(MODELS_STAGING / model, lab.repository / model))

# %% [markdown]
# ## One request to Triton, by hand
#
# GourmetGram's request, made with Triton's client library: one base64-encoded image in a `[1, 1]`
# `BYTES` tensor (a batch of one string).

# %%
photo = base64.b64encode(lab.sample_image()).decode()
image_input = triton_http.InferInput("INPUT_IMAGE", [1, 1], "BYTES")
image_input.set_data_from_numpy(np.array([[photo]], dtype=object))
answer = triton.infer(
    "food_classifier",
    [image_input],
    outputs=[triton_http.InferRequestedOutput("FOOD_LABEL"), triton_http.InferRequestedOutput("PROBABILITY")],
)
label = answer.as_numpy("FOOD_LABEL")[0, 0].decode()
probability = float(answer.as_numpy("PROBABILITY")[0, 0])
weights = triton.get_model_config("food_classifier")["parameters"]["weights"]["string_value"]
print(f"food_classifier says: {label} (probability {probability:.3f}); weights: {weights}")

# %% [markdown]
# If the weights are `untrained`, the label is arbitrary: only the timing means anything.
#
# ## Change what Triton serves
#
# Triton reads the staged file. Edit it, load the model again (`load_model`: the repository API
# above), and the config endpoint reports the change, as notebooks 6 and 7 will do with instances
# and batching.
#
# **Your turn.** Lower `max_batch_size` from 16 to 8 in the file's text.

# %%
config_file = lab.repository / "food_classifier" / "config.pbtxt"
as_staged = config_file.read_text()  # kept, to put back
# Your turn: edited = as_staged with its max_batch_size line set to 8 (a Python string's replace).
### BEGIN SOLUTION
edited = as_staged.replace("max_batch_size: 16", "max_batch_size: 8")
### END SOLUTION
config_file.write_text(edited)
triton.load_model("food_classifier")  # POST /v2/repository/models/food_classifier/load
print("Triton serves max_batch_size:", triton.get_model_config("food_classifier")["max_batch_size"])

# %% [markdown]
# Triton enforces what it read: 16 images in one request (a `[16, 1]` tensor) now exceed the
# largest batch. Then the file goes back, loaded again.

# %%
sixteen = triton_http.InferInput("INPUT_IMAGE", [16, 1], "BYTES")
sixteen.set_data_from_numpy(np.array([[photo]] * 16, dtype=object))
try:
    triton.infer("food_classifier", [sixteen])
    print("Triton answered all 16 images: the edit did not reach the file it read.")
except InferenceServerException as refused:
    print(f"Triton refused: {refused.message()}")
config_file.write_text(as_staged)
triton.load_model("food_classifier")
print("Back to max_batch_size:", triton.get_model_config("food_classifier")["max_batch_size"])

# %% [markdown]
# ## Many requests: perf_analyzer
#
# **perf_analyzer**, Triton's load generator, sends a model requests for a few seconds and reports
# its throughput and latency, with Triton's own account of where the time went.
#
# **Your turn.** Type a perf_analyzer line, as in a terminal, that sends `food_classifier` one
# request at a time. The lab adds its Triton (`-u`) and the photo as input.

# %%
# Your turn: first_command = "perf_analyzer ...", the model food_classifier, one request at a time,
#   in windows of 2 s (flags: -m, --concurrency-range, --measurement-interval in ms: Triton's
#   perf_analyzer CLI guide).
### BEGIN SOLUTION
first_command = "perf_analyzer -m food_classifier --concurrency-range 1 --measurement-interval 2000"
### END SOLUTION
lab.triton.perf_typed(first_command);  # perf_analyzer's own report, then the run kept

# %% [markdown]
# ## The web UI, now in front of Triton
#
# The next cell starts a GourmetGram that forwards photos to `food_classifier`, uploads one as your
# browser would (a multipart form to `/predict`), and reads the label from the page. Locally, open
# its address while the kernel runs. In Docker, point the Compose project's `gourmetgram` (port
# 8300, through your SSH tunnel) at Triton, on the Docker host:
# `GOURMETGRAM_TRITON_URL=triton:8000 FOOD11_MODEL_NAME=food_classifier docker compose up -d gourmetgram`.

# %%
ui = lab.ui("food_classifier")
print("It reports:", json.dumps(requests.get(f"{ui}/healthz", timeout=10).json(), indent=1))
ui.upload("soup.jpg")

# %% [markdown]
# The page names the backend and model: GourmetGram sent the file's
# bytes, and `model.py` did the decoding, preprocessing and inference.
#
# ## Questions
#
# 1. Triton's configuration endpoint reports what it really runs. What differed from
#    `config.pbtxt` here, and why does that matter when you compare your runs with another's?
# 2. GourmetGram sent Triton the photo's bytes. Where did decoding and preprocessing happen, and
#    what does that cost the model's instance?
# 3. With `max_batch_size: 8`, what did Triton answer to 16 images, and which file decided it?
#
# **Hand in:** the served config's printout, your edit and Triton's answer to it, and the
# GourmetGram page.
#
# ## Wrapping up
#
# In Docker, Triton stays up for `6_triton_bench.ipynb` (queueing, instances) and
# `7_triton_batching.ipynb` (bursty arrivals, dynamic batching). Locally, the next cell stops this
# notebook's services (in Docker it does nothing).

# %%
lab.stop()
