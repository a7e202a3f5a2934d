# %% [markdown]
# # 7. Triton: backends, bursty arrivals and dynamic batching
#
# Notebook 6 loaded Triton's Python-backend model with more clients and more instances. Here: the
# same network on the ONNX Runtime backend, users who arrive on their own schedule, and **dynamic
# batching**, Triton merging queued requests into one execution. Each experiment states an
# expectation, measures, and checks it against this run's numbers; a check's condition whose
# premise did not arise is NOT CHECKED. In Docker, cells run in the Jupyter container beside
# `triton`; without Docker, against a local CPU-only Triton.
#
# From notebook 6: `perf_analyzer`, Triton's load generator, runs **closed loop** with
# `concurrency` N (N clients, each sending when its last answer arrives). Triton reports where each
# request spent its time: **queue** (waiting for a free model **instance**, a copy of the model that
# runs one execution at a time) and **compute infer** (running the model).

# %%
# runs in the Jupyter container (Docker) or on your machine (local)
import shutil
import subprocess

import requests
import tritonclient.http as triton_http

from servelab.lab import Lab
from servelab.lessons import triton_bench

lab = Lab.connect("7_triton_batching")
# Triton's own client; loading several instances can take minutes on a busy CPU, hence the long timeout.
triton = triton_http.InferenceServerClient(lab.triton_http, network_timeout=600)

# %% [markdown]
# ## 1. The ONNX Runtime backend
#
# `food_classifier` runs PyTorch in Triton's Python backend: `model.py` decodes the JPEG and runs
# the network. `food_classifier_onnx` runs the exported graph on Triton's ONNX Runtime backend; the
# client preprocesses, and perf_analyzer sends random `[3, 224, 224]` tensors. (Locally, the Python
# backend runs it with ONNX Runtime: see its `served_by` parameter.)
#
# **Expectation.** With one client, the ONNX model has the lower mean latency. The difference
# measures the Python backend's per-request overhead (its process, PyTorch, decoding; locally
# both run behind Python, so PyTorch with decoding against ONNX Runtime). Throughput, 1 / the
# mean at one client, is not judged twice.

# %%
predicted_onnx_speedup = None  # before you run: the Python model's mean latency over the ONNX one's, one client (x)

# %%
onnx_single = lab.triton.perf("food_classifier_onnx", concurrency=1)
python_single = lab.triton.perf("food_classifier", concurrency=1)
lab.breakdown({"ONNX model": onnx_single, "Python-backend model": python_single})
lab.record(triton_bench.onnx_beats_python(onnx_single, python_single), predicted=predicted_onnx_speedup);

# %% [markdown]
# ### Scaling the ONNX model
#
# A config's `instance_group` says how many instances run, and where. **Your turn:** type the
# original lab's group for this model, `count: 2` on `gpus: [ 0, 1 ]`: `count` is per listed GPU,
# so four instances (without a GPU, `count` CPU instances, two). As in notebook 6,
# `lab.triton.configs.write_config` checks it and writes it into the `config.pbtxt` this Triton reads,
# printing the file; `load_model` makes Triton reread it, and `get_model_config` says what it runs.
#
# **Expectation.** At 8 clients, the larger group serves more requests per second than one
# instance, as long as one left hardware idle.

# %%
config_file = lab.repository / "food_classifier_onnx" / "config.pbtxt"
as_staged = config_file.read_text()  # kept, to put back
print(as_staged)


def load(model: str) -> int:
    """Triton rereads `model`'s config.pbtxt; what it now runs, as it reports it; the instances."""
    triton.load_model(model)
    served = triton.get_model_config(model)
    for group in served["instance_group"]:
        print(f"Triton runs {group['name']}: {group['count']} x {group['kind']}, GPUs {group['gpus']}")
    print("Dynamic batching:", served.get("dynamic_batching", "off"))
    return sum(group["count"] * max(1, len(group["gpus"])) for group in served["instance_group"])

# %%
predicted_onnx_instances = None  # before you run: how many times the requests/s of 1 the larger group serves (x)

# %%
# Your turn: two_on_each_gpu = "instance_group [ ... ]", count 2 on each of GPUs 0 and 1 in one group
#   (a group's fields: count, kind (KIND_GPU or KIND_CPU), gpus; Triton's model configuration guide,
#   "Instance Groups").
### BEGIN SOLUTION
two_on_each_gpu = "instance_group [ { count: 2, kind: KIND_GPU, gpus: [ 0, 1 ] } ]"
### END SOLUTION
onnx_one_busy = lab.triton.perf("food_classifier_onnx", concurrency=8)
lab.triton.configs.write_config(config_file, two_on_each_gpu)
onnx_instances = load("food_classifier_onnx")
onnx_scaled = {
    "c=1, 1 instance": onnx_single,
    "c=8, 1 instance": onnx_one_busy,
    f"c=8, {onnx_instances} instances": lab.triton.perf("food_classifier_onnx", concurrency=8),
}

# %% [markdown]
# Then 16 clients. On a GPU, `nvidia-smi` reads each GPU once a second beside the run:
# `utilization.gpu` is the share of that second in which it ran a kernel. Low on both GPUs while
# requests queue means each execution, one image, is too small to fill a GPU: what batching, below,
# is for.

# %%
smi = None
if shutil.which("nvidia-smi"):
    query = ["--query-gpu=timestamp,index,utilization.gpu,memory.used", "--format=csv", "--loop=1"]
    smi = subprocess.Popen(["nvidia-smi", *query], stdout=subprocess.PIPE, text=True)
else:
    print("No nvidia-smi in this machine or container: it has no NVIDIA GPU, or not its driver's tools (the groups "
          "Triton printed above say where the instances run). How full one image per execution leaves a GPU only a "
          "GPU can show: on the GPU node, this cell prints each GPU's use every second of the run.")
onnx_scaled[f"c=16, {onnx_instances} instances"] = lab.triton.perf("food_classifier_onnx", concurrency=16)
if smi:
    smi.terminate()
    print(smi.communicate()[0])
lab.breakdown(onnx_scaled)
lab.record(triton_bench.instance_scaling(onnx_one_busy, onnx_scaled[f"c=8, {onnx_instances} instances"],
                                        onnx_instances), predicted=predicted_onnx_instances);

# %% [markdown]
# At 16 clients, compare queue with compute: a longer queue means the instances are saturated.
#
# ## 2. The web UI with client-side pre- and post-processing
#
# GourmetGram, pointed at the ONNX model, preprocesses each photo and turns the 11 scores into a
# label itself. The next cell starts one and uploads a photo. In Docker, to use it from your
# browser (port 8300), on the Docker host:
#
# ```bash
# GOURMETGRAM_TRITON_URL=triton:8000 FOOD11_MODEL_NAME=food_classifier_onnx docker compose up -d gourmetgram
# ```

# %%
onnx_ui = lab.ui("food_classifier_onnx")
health = requests.get(f"{onnx_ui}/healthz", timeout=10).json()
print(
    f"GourmetGram at {onnx_ui}: backend {health['backend']!r}, model {health['model']!r}, weights {health['weights']}"
)
onnx_ui.upload("soup.jpg")
print("The model takes:", requests.get(f"{onnx_ui}/healthz", timeout=10).json()["model_input"])

# %% [markdown]
# It read the model's input from Triton (`model_input`); with untrained weights the label is
# arbitrary: the plumbing is what we checked.
#
# ## 3. Bursty arrivals: constant vs Poisson
#
# Users arrive on their own schedule, sometimes in clumps. perf_analyzer runs **open loop** here
# (`rate`: requests at an average rate, whether or not answers came back), evenly spaced
# (`constant`) or at random (`poisson`). One ONNX instance, as shipped. The original lab's rates
# suited one ONNX instance on one P100, so `lab.triton.capacity` measures one instance's capacity here and
# `lab.triton.scale_rates` keeps the rates' shares of it.
#
# **Expectation.** At the same average rate, Poisson arrivals queue more than evenly spaced ones:
# a longer wait in Triton's queue (by over a tenth of a compute time) and a p95 over 10% longer.
# Where neither run queued: NOT CHECKED.

# %%
predicted_poisson_queue_ms = None  # before you run: a request's wait in Triton's queue, Poisson arrivals (ms)

# %%
config_file.write_text(as_staged)  # back to one instance, as staged
load("food_classifier_onnx")
onnx_capacity = lab.triton.capacity("food_classifier_onnx")
rates = lab.triton.scale_rates([120, 180, 240, 300], onnx_capacity)

arrivals = {
    distribution: lab.triton.perf("food_classifier_onnx", rate=rates[0], distribution=distribution)
    for distribution in ("constant", "poisson")
}
lab.breakdown(arrivals)
lab.record(triton_bench.poisson_queues_more(arrivals["constant"], arrivals["poisson"], rates[0], onnx_capacity.rps),
           predicted=predicted_poisson_queue_ms);

# %% [markdown]
# ## 4. Dynamic batching
#
# Dynamic batching sends requests waiting in Triton's queue to the instance as one batch, one
# execution: a request in a clump waits for about one execution. Triton forms the largest
# `preferred_batch_size` it can (else any size up to `max_batch_size`), and
# `max_queue_delay_microseconds` holds a request that long for others to join.
#
# First the baseline, without batching: Poisson arrivals at each rate, with Triton's statistics of
# each run (the batches it ran).

# %%
predicted_queue_share = None  # before you run: the queue wait at the highest rate with batching, over without (x)
predicted_latency_growth = None  # and the growth of the mean latency with batching, lowest rate to highest (x)


# %%
def poisson_runs() -> dict:
    return {
        f"{rate:g} req/s": lab.triton.perf("food_classifier_onnx", rate=rate, distribution="poisson", triton_stats=True)
        for rate in rates
    }


without_batching = poisson_runs()
lab.breakdown(without_batching);

# %% [markdown]
# **Your turn.** Type the original lab's `dynamic_batching` block: preferred sizes 4, 6 and 8, and
# at most 100 microseconds of delay. Then the same runs.

# %%
# Your turn: batching = """dynamic_batching { ... }""" with preferred batch sizes 4, 6 and 8 and a
#   delay of at most 100 microseconds (fields: preferred_batch_size, max_queue_delay_microseconds;
#   how: Triton's model configuration guide, "Dynamic Batcher").
### BEGIN SOLUTION
batching = """
dynamic_batching {
  preferred_batch_size: [ 4, 6, 8 ]
  max_queue_delay_microseconds: 100
}
"""
### END SOLUTION
lab.triton.configs.write_config(config_file, batching)
load("food_classifier_onnx")
with_batching = poisson_runs()
lab.breakdown(with_batching);

# %% [markdown]
# Clients sent one image per request, so any larger batch was formed by the server. Below the
# plot: the compute per image at each batch size, at the highest rate.

# %%
triton_bench.show_batches(without_batching, with_batching)

# %% [markdown]
# **Expectation.** From the original lab:
#
# 1. where requests queued without batching (a wait of one compute time or more), batching
#    shortens the wait;
# 2. with batching, the mean latency stays roughly flat as the rate grows (at most 1.5 times the
#    lowest rate's), and grows less than without.
#
# The second needs a batched image to cost less than one alone; else the wait only moves into a
# longer execution.

# %%
lab.record(triton_bench.batching_shortens_the_queue(without_batching, with_batching),
           predicted=predicted_queue_share)
lab.record(triton_bench.batching_keeps_latency_flat(without_batching, with_batching),
           predicted=predicted_latency_growth);

# %% [markdown]
# ### The queueing view
#
# Kendall's notation names a queue arrivals/service/servers: M is Poisson (memoryless) arrivals,
# D a deterministic service time, G a general one. With S = 1 / the measured capacity, the runs
# without batching are an M/D/1 queue: the wait grows slowly, then sharply near capacity. M/G/1
# adds how much a request's time varies. Each model's estimate adds the wait to a request's time
# alone; the plot adds the constant-arrival run of section 3.

# %%
triton_bench.show_queueing(without_batching, onnx_capacity, constant=arrivals["constant"])

# %% [markdown]
# ## Wrapping up
#
# The ONNX model's file back as it was, loaded again; then all runs and the verdicts.

# %%
config_file.write_text(as_staged)
load("food_classifier_onnx")
lab.table()
lab.verdicts();

# %% [markdown]
# ## Questions
#
# 1. Where did the ONNX model gain or lose time against the Python backend? Use the breakdown.
# 2. At the same rate, did Poisson arrivals queue more than evenly spaced ones? Why?
# 3. Did dynamic batching keep the latency flat here? Use the compute per image to explain.
#
# **Hand in:** the results table and the plots, with your predictions beside the verdicts.

# %% [markdown]
# Part 1 ends here. On the node, save this notebook, then run notebook 2's last cell (Chameleon's
# Jupyter): it copies your work off. Locally, the next cell stops the services.

# %%
lab.stop()
