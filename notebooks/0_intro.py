# %% [markdown]
# # 0. System optimizations for serving: start here
#
# In earlier work on model optimization, the goal was to make one forward pass faster. A user of
# an ML service does not see the forward pass, though. They see the time from sending a request to
# getting an answer, and that time has more parts than the model:
#
# - **inference time**: the model actually computing a prediction;
# - **queueing delay**: the request waiting, because the server is busy with requests that
#   arrived before it;
# - and the rest: moving the request over the network, decoding and preprocessing the image,
#   turning the output into an answer.
#
# A model that takes a few milliseconds per image can still answer slowly when many requests
# arrive at once, because most of their time is spent waiting in line. This lab is about the
# *system* around the model, the part that decides how long requests wait.
#
# ## What you will learn
#
# You will serve one image classifier (a MobileNetV2 for the eleven Food-11 classes, behind a
# small web app called GourmetGram) in several ways, measure each, and explain what you see:
#
# 1. **Queueing delay versus inference time.** Send requests one at a time, then many at once, to
#    the same server, and see latency grow although the model did not get slower.
# 2. **Concurrency.** Find out how many requests a server can usefully work on at once, and what
#    happens to latency and throughput when more than that arrive.
# 3. **Model instances.** In NVIDIA Triton Inference Server, run several copies of the model
#    (on one GPU, then on two) so that more requests are served in parallel.
# 4. **Dynamic batching.** Let Triton hold a request for a moment so that it can join others in
#    one batch, and see when that short wait pays for itself.
# 5. **I/O outside the predict slot.** Fetch the photo from an object store by URL, and see why
#    the download must not hold the slot the model runs in.
# 6. **The concurrency target.** Serve the model in Ray Serve replicas that autoscale, and tell
#    the requests a replica takes (what triggers scaling) from the requests it runs at once.
# 7. **Cancellation.** Stop computing for clients who gave up, in FastAPI, Triton and Ray Serve,
#    and measure what that frees for the clients who stayed.
# 8. **Stateful sequences.** Keep per-sequence state on the server, and batch frames of different
#    sequences together with Triton's sequence batcher.
#
# Along the way you will meet the tools the measurements are made with, which you can also use on
# your own services:
#
# - the lab's **load generator** (`servelab.loadgen`): a *closed loop* keeps a fixed number of
#   requests in flight, an *open loop* sends requests at a fixed rate whatever the server does;
# - Triton's **perf_analyzer**, the standard benchmark client for Triton;
# - Triton's **statistics** endpoint, which splits each request's time on the server into time
#   queued and time computing;
# - a **resource sampler** that records CPU and GPU utilization during a run and plots it, so you
#   can see which part of the machine is the bottleneck.
#
# ## Two parts
#
# - **Part 1, the original lab (notebooks 0-7)**, on the GPU node, in one 3-hour lease. Notebook 1
#   prints the plan of the lease: each notebook's time, from its reading, its measured run time and
#   the steps you do, leaves at least half an hour to spare.
# - **Part 2, four more lessons (notebooks 8-11)**, anywhere and without a lease: local JupyterLab
#   (`make up`) or the lab's Compose project, with or without a GPU. On the node too, if your lease
#   has time left.
#
# Each notebook says at its top what it teaches and how long it takes.
#
# | notebook | part | what it does | where it runs |
# | --- | --- | --- | --- |
# | `0_intro` | 1 | this overview | anywhere |
# | `1_reserve` | 1 | reserves a GPU node on Chameleon | Chameleon's Jupyter server |
# | `2_bring_up_node` | 1 | starts and sets up that node | Chameleon's Jupyter server |
# | `3_fastapi` | 1 | the model behind a FastAPI service | node's Jupyter container, or laptop |
# | `4_fastapi_bench` | 1 | benchmarks the FastAPI service | node's Jupyter container, or laptop |
# | `5_triton` | 1 | the same model in Triton | node's Jupyter container, or laptop |
# | `6_triton_bench` | 1 | Triton benchmarks: queueing, instances | node's Jupyter container, or laptop |
# | `7_triton_batching` | 1 | Triton: ONNX backend, bursts, dynamic batching | node's Jupyter container, or laptop |
# | `8_io_vs_compute` | 2 | images by URL: I/O outside the slot | anywhere the lab runs |
# | `9_concurrency_target` | 2 | Ray Serve: the concurrency target, autoscaling | anywhere the lab runs |
# | `10_cancellation` | 2 | clients who leave: cancelled or computed anyway | anywhere the lab runs |
# | `11_stateful_sequences` | 2 | stateful models, Triton's sequence batcher | anywhere the lab runs |
# | `appendix_triton_crash` | optional | probing a Triton 2.51 crash under gRPC cancellation | local services |
#
# Every number a notebook shows is measured in the run you are looking at; the text never quotes
# results from somewhere else. Where the lesson predicts a trend (for example, "latency grows with
# concurrency"), a cell states the expectation, measures, and tells you whether it held on *your*
# hardware, and why it may not have.
#
# The model's weights are, by default, a seeded *untrained* MobileNetV2: it costs exactly as much
# to run as a trained one, so every time you measure is real, but its predicted labels are not
# meaningful. The repository's README explains how to serve a trained Food-11 checkpoint instead.

# %% [markdown]
# ## Two ways to run the lab
#
# ### On Chameleon, with two GPUs (the full lab)
#
# You need a [Chameleon](https://chameleoncloud.org) account that is a member of a project, and an
# SSH key pair added to the **CHI@TACC** site (the lab calls the private key
# `~/.ssh/id_rsa_chameleon`). The lab uses one bare-metal node of type **`gpu_p100`**, which has
# two NVIDIA P100 GPUs, for about **3 hours**. Such nodes are shared by everyone on Chameleon, so
# reserve one ahead of time, and read the notebooks before your reservation starts, so the hours
# go to running experiments rather than reading.
#
# **Opening the lab there.** Log in to Chameleon's JupyterHub (Experiment > Jupyter Interface).
# If your course shared the lab as a Trovi artifact, open the artifact's page and choose *Launch
# on Chameleon*: a copy of this repository opens in your Jupyter server. Otherwise open a terminal
# in JupyterHub and `git clone` the repository's URL. Open `notebooks/0_intro.ipynb` (this one),
# then continue with **`1_reserve.ipynb`**.
#
# ### On your own machine, CPU only
#
# Any Linux x86_64 laptop or desktop with Python 3.11 or newer works; no GPU and no Docker are
# needed. From the repository root, run
#
# ```bash
# make up
# ```
#
# It creates the virtual environment, builds the model files, starts every service on
# 127.0.0.1 (FastAPI, Triton, Ray Serve, GourmetGram, the image host) and JupyterLab, and prints
# JupyterLab's URL. Open that
# URL, skip notebooks 1 and 2 (they only reserve and set up Chameleon hardware), and continue with
# **`3_fastapi.ipynb`**. Ctrl-C in the terminal running `make up` stops everything.
#
# The lessons are the same on both paths. The numbers are not: a CPU is much slower than a P100,
# and it runs the load generator, the servers and the model all at once, so a few expectations may
# not hold there. The notebooks say when that happens and why.

# %% [markdown]
# ## Where are you running?
#
# The notebooks read where the lab's services are from the `LAB_SERVICES` environment variable:
# `local` (the default: the lab's services as processes on this machine), `compose` (the services
# of the lab's Docker Compose project, from its Jupyter container, on the GPU node or any machine
# with Docker; that container sets it for you) or `chameleon` (Chameleon's own Jupyter server, where
# notebooks 1 and 2 reserve and set up the node). On Chameleon's Jupyter server, the next cell sets
# it (a JupyterHub sets `JUPYTERHUB_API_URL`; your laptop's JupyterLab does not), unless you set
# `LAB_SERVICES` yourself.
#
# Run the cell: it prints where the services are, and, when they are local, what this machine has
# to work with. Next: `1_reserve.ipynb` on Chameleon, or `3_fastapi.ipynb` anywhere else.

# %%
import os
import sys
from pathlib import Path

# The repository root (above notebooks/, or notebooks/student/), so `servelab` imports where the lab
# is not pip-installed (Chameleon's Jupyter server). servelab.lessons.node needs only the standard library.
REPO_ROOT = next((folder for folder in Path.cwd().parents if (folder / "servelab").is_dir()), Path.cwd().parent)
sys.path.insert(0, str(REPO_ROOT))
from servelab.lessons.node import current_services, machine_info

if os.environ.get("JUPYTERHUB_API_URL"):
    os.environ.setdefault("LAB_SERVICES", "chameleon")

services = current_services()
print(f"LAB_SERVICES: {services}")
if services == "local":
    machine = machine_info()
    gpus = ", ".join(machine["gpus"])
    print(f"CPU: {machine['cpu']} ({machine['cores']} logical cores)")
    print(f"GPU: {gpus}")
    print(f"Platform: {machine['platform']}")
    print("Next: 3_fastapi.ipynb (notebooks 1 and 2 are for Chameleon only).")
else:
    print("Next: 1_reserve.ipynb to reserve the GPU node, or, if you are already in the Jupyter")
    print("container on a node you set up with notebook 2, 3_fastapi.ipynb.")
