# %% [markdown]
# # 6. Benchmarking Triton: queueing, instances, backends and dynamic batching
#
# **Time:** about 36 minutes (16 reading, 9 running, 11 hands-on; `python -m servelab.time_plan`)
#
# In the previous notebook we brought up Triton and looked inside its model repository. Now we
# load it with traffic and watch where a request's time goes. Every experiment follows the same
# pattern: we state what we expect to see and why, measure it, and then check the expectation
# against this run's own numbers. Some expectations come from the GPU node this lab was written
# for and may not hold on a laptop's CPU; when one does not, the check says so and explains why.
#
# **Where things run.** In Docker (the GPU node, or any machine with Docker), the Python cells
# run in the Jupyter container of the lab's Compose project, next to the `triton` service they
# measure, and the shell commands run on the Docker host (on the node, in your SSH session). On
# your own machine without Docker, every cell runs locally against a Triton server the notebook
# starts, CPU only.
#
# **The tool.** We measure with `perf_analyzer`, the load generator that ships with Triton's
# client library. It runs in one of two modes:
#
# - **closed loop** (`concurrency`): N simulated clients, each sending its next request as soon
#   as the previous answer arrives, so there are always N requests in flight;
# - **open loop** (`rate`): requests sent at a fixed average rate, whether or not earlier ones
#   have been answered, with either evenly spaced (`constant`) or random (`poisson`) gaps.
#
# It measures in windows, repeating them until consecutive windows agree, and reports the
# client-side latency along with Triton's own account of where each request spent its time:
#
# - **server queue**: waiting in Triton's queue for a free model instance;
# - **compute input / infer / output**: preparing the input tensors, running the model, and
#   collecting the outputs;
# - **network + server send/recv**, **client send/recv**: moving bytes between client and server.
#
# `lab.triton.perf(...)` runs perf_analyzer with the window length of this notebook's profile (short
# windows in the `quick` profile used by the tests, longer ones in `full`), prints a one-line
# summary, and keeps every result for the table at the end.

# %%
# runs in the Jupyter container (Docker) or on your machine (local)
import matplotlib.pyplot as plt
import numpy as np
import requests

from servelab.lab import Lab
from servelab.lessons import triton_bench
from servelab.lessons.expectations import figure, measured
from servelab.measure import queueing
from servelab.measure.resources import summarize
from servelab.report import plots

lab = Lab.connect("6_triton_bench")
print(f"The models run on {lab.hardware()}.")

# %% [markdown]
# A few helpers do the bookkeeping in every experiment below:
#
# - `lab.triton.perf(model, ...)` runs perf_analyzer, and tries once more when it finds no stable
#   measurement; if no attempt settles, it says so and returns `None` instead of a number. Each
#   result is labelled with the model's configuration (instances, dynamic batching), and carries
#   what the machine did meanwhile, down to the CPU of each instance's process.
# - `lab.breakdown({...})` prints, for named runs, throughput, latency, and the two server-side
#   stages that matter here: time in Triton's queue and time computing (`compute infer`).
#   A tail percentile needs enough requests: p95 of fewer than 20 requests shows as n/a.
# - `lab.record(triton_bench.<check>(...))` records an expectation, as a check of
#   `servelab/lessons/triton_bench.py` states it: its conditions, each judged on its own figures,
#   numbers read from the runs in the tables, so a verdict never says what its table does not. A
#   condition whose run gave no number is NOT CHECKED; so is one whose premise did not arise in
#   this run (no queue formed, say), with the figures that show it.

# %% [markdown]
# ## 1. The Python-backend model under concurrency
#
# `food_classifier` runs PyTorch inside Triton's Python backend, one instance, no dynamic
# batching: it executes one request at a time.
#
# **Expectation.** With one client, a request never waits: its latency is its compute time.
# With 8 or 16 clients, each request finds the others ahead of it, so it waits in Triton's
# queue for roughly (clients - 1) service times. The time spent *computing* each request should
# stay about the same (within 50% of its lowest); the time spent *queueing* should grow with the
# number of clients: from 1 to 8, and again from 8 to 16, by more than one compute time of a
# request alone, the least that several more requests ahead of it add (a smaller rise is noise).
# All of it presumes that the clients did load the server: where Triton held fewer than two
# requests at a time at 16 clients (requests per second x time in the server), the load generator
# never had a second request there, nothing could queue, and the check says NOT CHECKED.

# %%
predicted_queueing_grows = None  # before you run: True if the queue wait grows with the clients, the compute
# time staying about the same, else False (the next cell records it)
python_backend = {f"c={c}": lab.triton.perf("food_classifier", concurrency=c) for c in (1, 8, 16)}
lab.breakdown(python_backend);

# %%
lab.record(triton_bench.queueing_grows({c: python_backend[f"c={c}"] for c in (1, 8, 16)}, lab.hardware(), lab.cores),
           predicted=predicted_queueing_grows);

# %% [markdown]
# **Your turn.** Type a perf_analyzer command yourself, as the original lab did in a terminal:
# the same model at a concurrency of your choice. The lab adds only where its Triton is (`-u`)
# and where the report goes (`-f`), prints what perf_analyzer printed, and adds each load level
# to this notebook's table. A line it will not run (another server, a model it lacks) gets a
# message that says what to change.

# %%
from servelab.triton.perf_analyzer import PerfAnalyzerError
from servelab.triton.typed_command import TypedCommandError

my_command = "perf_analyzer -m food_classifier --concurrency-range 4 --measurement-request-count 20"  # edit me
try:
    lab.table(lab.triton.perf_typed(my_command))
except TypedCommandError as refused:
    print(f"Not run: {refused}")
except PerfAnalyzerError as failed:  # perf_analyzer's own message: an option it does not know, no stable number...
    print(f"perf_analyzer gave no number:\n{failed}")

# %% [markdown]
# ### Batching on the client side
#
# Now one client sends batches of 16 images per request. `model.py` stacks them and runs
# MobileNetV2 once on the whole stack.
#
# **Expectation.** On a GPU, a batch of 16 costs little more time than a batch of 1: the GPU
# processes the 16 images in parallel, and a single image leaves most of it idle. The claim is
# about the model's work, so we judge it on Triton's own account, `compute infer` (the time
# `model.py` spent on the request; for this model that includes decoding each image), not on the
# client's latency, which also counts uploading 16 photos:
#
# 1. Triton computes a request of 16 images in less than twice the time of a request of 1;
# 2. so the client gets at least 4 times the images per second.

# %%
predicted_client_batching = None  # before you run: True if 16 images compute in under twice the time of 1
# (so at least 4 times the images per second), else False
batch_of_16 = lab.triton.perf("food_classifier", concurrency=1, batch_size=16)
lab.breakdown({"1 image per request": python_backend["c=1"], "16 images per request": batch_of_16})
lab.record(triton_bench.client_batching(python_backend["c=1"], batch_of_16, lab.hardware(), lab.cores),
           predicted=predicted_client_batching);

# %% [markdown]
# Batching raises throughput on a GPU, but only when a client *has* 16 images at once. Our users
# each send one photo, so this is not yet a fix for queueing. Two other ways are: run more
# copies of the model, and let the server form batches itself.
#
# ## 2. More instances of the Python-backend model
#
# If one instance is busy, a second could serve the next request in parallel. The lab's
# original GPU node has two GPUs; the next cell asks for two instances on each of them (four
# in all) by editing `instance_group`, and reloads the model. The printout shows the edit to
# `config.pbtxt`, and, where the server has no GPU, how it is adapted to the CPU: the same number
# of instances, as CPU instances. Where it has fewer GPUs than the config names, the instances
# written for the GPUs it lacks run on the GPUs it has, as many as written, and the printout says
# so. Triton then starts one Python process per instance.
#
# On the GPU node, run `nvidia-smi` on the node host afterwards: it lists a
# `triton_python_backend_stub` process per instance, two on each GPU. In Docker the instances run
# in the Triton container, out of this notebook's sight, so there each run records the GPUs'
# utilization; on your own machine it records the CPU of every instance's process.

# %%
predicted_instances = None  # before you run: True if 4 instances serve more than 1, and 8 no more than 4, else False
# (recorded after the runs with 8 instances below)
two_per_gpu = [{"count": 2, "kind": "KIND_GPU", "gpus": [0]}, {"count": 2, "kind": "KIND_GPU", "gpus": [1]}]
lab.triton.apply_config("food_classifier", lab.triton.config("food_classifier").with_instance_groups(two_per_gpu))
print(f"Triton now runs {lab.triton.served_instances('food_classifier')} instances of food_classifier")
four_instances = lab.triton.perf("food_classifier", concurrency=8)

# %% [markdown]
# Eight clients and four instances: each request should wait for less, as long as the
# hardware can actually run four forward passes at once. Let us push further, to four
# instances per GPU (eight in all):

# %%
four_per_gpu = [{"count": 4, "kind": "KIND_GPU", "gpus": [0]}, {"count": 4, "kind": "KIND_GPU", "gpus": [1]}]
lab.triton.apply_config("food_classifier", lab.triton.config("food_classifier").with_instance_groups(four_per_gpu))
print(f"Triton now runs {lab.triton.served_instances('food_classifier')} instances of food_classifier")
eight_instances = lab.triton.perf("food_classifier", concurrency=8)

# %% [markdown]
# **Expectation.** More instances help while the hardware has idle capacity: requests no longer
# wait for a single model. Once the hardware is busy, more instances only fight over it: each
# Python-backend instance is a whole process with its own PyTorch, its own decoding, and a copy
# of every tensor through shared memory.
#
# On a CPU the instances share the cores the way FastAPI's slots do: an inference gets the cores
# divided by the instances at work (decoding or inferring) when it starts, at least one thread (each
# instance's log states its plan). So the question is how much of the machine one instance
# leaves unused. One instance runs one request at a time: it decodes the image on one
# thread while the other cores wait, then splits one image's inference over all the cores, whose
# threads wait for each other at every layer (a thread that busy-waits still shows as CPU in
# use). Several instances each run a whole request on their own core, with no one to wait for.
# The two conditions:
#
# 1. from one instance to four, throughput rises (by more than the few percent two runs of the
#    same setting differ by);
# 2. eight instances do no better than four (at most those few percent more, or fewer): the unused
#    capacity is used up, and the extra instances only take turns.
#
# The instances' own CPU (the sum over their processes, in % of one core, out of 100% per core)
# says how busy they kept the machine, and the requests served per second of CPU how usefully.

# %%
scaling = {"1 instance": python_backend["c=8"], "4 instances": four_instances, "8 instances": eight_instances}
lab.breakdown(scaling)
rate = {name: figure(result, "throughput_rps", name) for name, result in scaling.items()}
instances_cpu = {
    name: measured(f"instances' CPU with {name}", sum(summarize(result.resources).get("processes", {}).values()),
                   "% of a core")
    for name, result in scaling.items()
    if result is not None and result.resources and summarize(result.resources).get("processes")  # seen from here
}
for name, used in instances_cpu.items():
    print(
        f"{name}: the instances used {used.value:.0f}% of a core, of the {100 * lab.cores}% this machine has; "
        f"{rate[name].value / (used.value / 100):.1f} requests per second of CPU"
    )
lab.record(triton_bench.instances_stop_helping({1: scaling["1 instance"], 4: four_instances, 8: eight_instances},
                                              lab.hardware(), lab.cores), predicted=predicted_instances);

# %% [markdown]
# What the machine did during each run, in place of the original lab's nvtop screenshots. On your
# own machine: the CPU of each instance's process, stacked (100% is one core busy all the time);
# the dashed line is every core busy. Where the stack reaches the line, more instances can only
# take turns. In Docker: the machine's CPU and the GPUs' utilization, from the Jupyter container.

# %%
for name, result in scaling.items():
    if result is None:
        continue
    summary = summarize(result.resources)
    gpus = ", ".join(f"GPU {gpu['index']} {gpu['util_percent_mean']}%" for gpu in summary["gpus"]) or "no GPU"
    print(f"{name}: machine CPU {summary['cpu_percent_mean']}% of all {lab.cores} cores; {gpus}")
if not lab.on_compose:
    plots.plot_process_cpu(scaling, lab.cores, title="food_classifier at 8 clients: CPU of each instance")
    plt.show()

# %% [markdown]
# Back to the configuration as shipped (one instance), before we move on:

# %%
lab.triton.restore_config("food_classifier")

# %% [markdown]
# ## 3. The ONNX Runtime backend
#
# The Python backend is flexible, but every request goes through a Python process. Triton's
# ONNX Runtime backend runs the exported graph natively, with the preprocessing moved to the
# client (`food_classifier_onnx`, seen in the previous notebook). perf_analyzer now sends
# random tensors of the model's input shape `[3, 224, 224]` instead of an image file.
#
# On your own machine, remember the local adaptation: this model is served by a Python-backend
# model that runs the same `model.onnx` with ONNX Runtime (its `served_by` parameter says so).
# The comparison below is then ONNX Runtime without image decoding against PyTorch with image
# decoding, both behind a Python process, rather than a native backend against Python.
#
# **Expectation.** For one client at a time, the ONNX model serves requests faster than the
# Python-backend model: a lower mean latency. (With one client, each request starts as the last
# one ends, so its requests per second are one over that mean: the same number, judged once.)

# %%
predicted_onnx_faster = None  # before you run this cell: True if ONNX answers one client faster than Python, else False
onnx_single = lab.triton.perf("food_classifier_onnx", concurrency=1)
python_single = python_backend["c=1"]
lab.record(triton_bench.onnx_beats_python(onnx_single, python_single,
                                          lab.triton.served_config("food_classifier_onnx").get("backend") == "python",
                                          lab.hardware()), predicted=predicted_onnx_faster);

# %% [markdown]
# ### Scaling the ONNX model
#
# The original lab then gave the ONNX model two instances on each of the two GPUs, with one
# group `count: 2`, `gpus: [ 0, 1 ]` (for a GPU group, `count` is per listed GPU: four instances
# in all). Locally that group becomes two CPU instances, sharing the cores as above; on a server
# with one GPU, all four run on that GPU. First one instance under 8 clients, for comparison;
# then the new configuration with 8 and 16.
#
# **Expectation.** Under load, the larger group serves more requests per second than one
# instance, as long as one instance left hardware idle.

# %%
predicted_onnx_instances = None  # before you run: True if the larger group serves more requests/s than 1, else False
onnx_one_busy = lab.triton.perf("food_classifier_onnx", concurrency=8)
two_on_each_gpu = [{"count": 2, "kind": "KIND_GPU", "gpus": [0, 1]}]
lab.triton.apply_config(
    "food_classifier_onnx", lab.triton.config("food_classifier_onnx").with_instance_groups(two_on_each_gpu)
)
onnx_instances = lab.triton.served_instances("food_classifier_onnx")
print(f"Triton now runs {onnx_instances} instances of food_classifier_onnx")
onnx_scaled = {
    "c=1, 1 instance": onnx_single,
    "c=8, 1 instance": onnx_one_busy,
    f"c=8, {onnx_instances} instances": lab.triton.perf("food_classifier_onnx", concurrency=8),
    f"c=16, {onnx_instances} instances": lab.triton.perf("food_classifier_onnx", concurrency=16),
}
lab.breakdown(onnx_scaled)
lab.record(triton_bench.instance_scaling(onnx_one_busy, onnx_scaled[f"c=8, {onnx_instances} instances"],
                                        onnx_instances, lab.hardware(), lab.cores), predicted=predicted_onnx_instances);

# %% [markdown]
# Compare the queue column with the compute column at 16 clients. When requests arrive faster
# than the instances can serve them, the average request spends longer waiting in the queue
# than being computed: the hardware is busy, and the rest is queueing delay.
#
# ## 4. The web UI with client-side pre- and post-processing
#
# The ONNX model wants a preprocessed tensor and returns 11 raw scores, so GourmetGram has to
# do the decoding, resizing and normalizing before it calls Triton, and the softmax and the
# label after. The same app does this when it is pointed at `food_classifier_onnx`.
#
# The next cell starts a second GourmetGram, pointed at the ONNX model, asks it which backend it
# uses and uploads a photo to it, as a browser would. In Docker, put the project's own
# `gourmetgram` service (your browser's, port 8300) in front of it on the Docker host, and upload a
# photo there too; name the service, so that Compose recreates only that container:
#
# ```bash
# # runs on the Docker host (the node)
# GOURMETGRAM_TRITON_URL=triton:8000 FOOD11_MODEL_NAME=food_classifier_onnx docker compose up -d gourmetgram
# ```

# %%
onnx_ui = lab.ui("food_classifier_onnx")
health = requests.get(f"{onnx_ui}/healthz", timeout=10).json()
print(
    f"GourmetGram at {onnx_ui}: backend {health['backend']!r}, model {health['model']!r}, weights {health['weights']}"
)
lab.upload_to_ui(onnx_ui, "soup.jpg", lab.sample_image())
print("The model takes:", requests.get(f"{onnx_ui}/healthz", timeout=10).json()["model_input"])

# %% [markdown]
# GourmetGram read the model's metadata from Triton, saw that it takes a preprocessed tensor
# (the `model_input` above, and the result page's "request: ..." line), so it decoded and
# preprocessed the photo itself, sent Triton a `[1, 3, 224, 224]` float tensor, and turned the 11
# scores into a label and a probability. (With untrained weights, the label is arbitrary; the
# plumbing is what we checked.)
#
# ## 5. Bursty arrivals: constant vs Poisson
#
# So far the load was a fixed number of clients. Real users arrive on their own schedule: the
# *average* rate may be modest while, now and then, several requests land at almost the same
# moment. We go back to one ONNX instance and send requests at a fixed average rate.
#
# The original lab used 120, 180, 240 and 300 requests per second, chosen for its two P100 GPUs.
# A rate means something only next to what the server can serve: on a slower machine those rates
# would overload the server, and on a faster GPU they would leave it idle, so that the checks
# below would judge noise. What carries over from the original is their shape, from light load to
# close to saturation. So first `lab.triton.capacity` measures what one ONNX instance can do on this
# server, once: a request alone (its latency, and how much that varies), and the requests per
# second it completes when it is never idle. That one capacity figure is used from here on: to turn
# the four rates into the same shares of it on every device, a CPU or any GPU (the cell prints the
# figures), and by the queueing models at the end.
#
# In open-loop mode the throughput just follows the rate we chose, so we look at latency only.
#
# **Expectation.** At the same average rate, Poisson arrivals queue more than evenly spaced
# ones: with even spacing each request finds the previous one finished, while random spacing
# produces clumps that have to wait. So a request waits longer in Triton's queue (by more than a
# tenth of a compute time: less is noise between two runs), and the slow tail (p95) is more than
# 10% longer. Where neither run queued at all (both under a tenth of a compute time), neither can
# queue more than the other, and the check says NOT CHECKED.

# %%
predicted_poisson_queues_more = None  # before you run: True if Poisson arrivals queue longer than even ones, else False
lab.triton.restore_config("food_classifier_onnx")
onnx_capacity = lab.triton.capacity("food_classifier_onnx")
rates = lab.triton.scale_rates([120, 180, 240, 300], onnx_capacity)

arrivals = {
    distribution: lab.triton.perf("food_classifier_onnx", rate=rates[0], distribution=distribution)
    for distribution in ("constant", "poisson")
}
lab.breakdown(arrivals)
lab.record(triton_bench.poisson_queues_more(arrivals["constant"], arrivals["poisson"], rates[0], onnx_capacity.rps,
                                            lab.hardware(), lab.cores), predicted=predicted_poisson_queues_more);

# %% [markdown]
# ## 6. Dynamic batching
#
# More instances would absorb the bursts, but would sit idle between them. Dynamic batching
# uses the instance we have differently: requests waiting in Triton's queue go to the instance
# together, as one batch, in one execution. A request that arrives in a clump then waits for
# about one execution, not for all the requests ahead of it one by one.
#
# How Triton forms a batch when an instance frees up (its documentation, "Dynamic Batcher"):
# without preferred sizes, it takes as many waiting requests as it can, up to the model's
# `max_batch_size`; with `preferred_batch_size`, it forms the largest *preferred* size it can, and
# only when none can be formed, the largest batch it can below `max_batch_size`.
# `max_queue_delay_microseconds` lets it hold a request that long for others to join. Triton's
# guide advises leaving preferred sizes out for most models (they are meant for backends, such as
# TensorRT, whose engines are built for given sizes); we keep the original lab's settings, so that
# your numbers compare with its.
#
# First, the baseline: Poisson arrivals at each of the four rates *without* dynamic batching.
# Around each run we read Triton's statistics (`/v2/models/food_classifier_onnx/stats`) before
# and after, which tell us how many executions ran at each batch size.


# %%
predicted_batching_shortens_queue = None  # before you run: True if batching shortens the queue wait, else False
predicted_batching_flat = None  # and True if with batching the mean latency stays roughly flat as the rate grows
# (and grows less than without), else False; both recorded after the runs with batching below


def poisson_sweep() -> dict:
    """Poisson runs at every rate, each with the server's statistics over that run."""
    sweep = {}
    for rate in rates:
        result = lab.triton.perf("food_classifier_onnx", rate=rate, distribution="poisson", triton_stats=True)
        sweep[f"{rate:g} req/s"] = result
        if result is not None:
            stats = result.triton_stats
            print(
                f"    server: {stats['inference_count']} inferences in {stats['execution_count']} executions "
                f"(average batch {stats['avg_batch_size']:.2f})"
            )
    return sweep


without_batching = poisson_sweep()
lab.breakdown(without_batching);

# %% [markdown]
# Now we turn dynamic batching on, with the original lab's block: batches of 4, 6 or 8 are
# preferred, and a request may be held back for at most 100 microseconds waiting for others to join
# its batch. Then the same four runs:

# %%
batching = lab.triton.config("food_classifier_onnx").with_dynamic_batching(
    preferred_batch_size=[4, 6, 8], max_queue_delay_microseconds=100
)
lab.triton.apply_config("food_classifier_onnx", batching)
print("dynamic_batching in the served config:",
      lab.triton.served_config("food_classifier_onnx").get("dynamic_batching"))

with_batching = poisson_sweep()
lab.breakdown(with_batching);
# %% [markdown]
# Which batch sizes ran? Every client sent a single image per request, so any execution with a
# batch larger than 1 was formed by the server. The runs differ in length, so each bar is the
# share of that run's inferences served in executions of that size:

# %%
batch_histograms = {
    f"{name}, {'dynamic batching' if batched else 'no batching'}": result.triton_stats
    for batched, sweep in ((True, with_batching), (False, without_batching))
    for name, result in sweep.items()
    if result is not None and (batched or name == f"{rates[-1]:g} req/s")
}
plots.plot_batch_sizes(batch_histograms, share=True, title="food_classifier_onnx: inferences by batch size executed")
plt.show()
largest_batch = max(
    (size for stats in batch_histograms.values() for size, count in stats["executions_by_batch_size"].items() if count),
    default=0,
)
print(f"The largest batch that ran: {largest_batch}.")

# %% [markdown]
# **Expectation.** Two claims, from the original lab:
#
# 1. where requests queue without batching, batching shortens their wait in Triton's queue: a
#    clump that has formed is served in one execution instead of one request after another. Where
#    they hardly queued (a mean wait shorter than the compute time: most requests found the
#    instance idle), there is little to shorten, and the check lists that rate as not judged;
# 2. its headline: with batching on, the mean latency stays roughly flat as the rate grows (at the
#    highest rate at most 1.5 times the lowest rate's), and grows less than without batching.
#
# Whether the second can hold depends on what a batch costs. Forming a batch of 8 raises what the
# instance can serve only if an image in it costs less compute than an image alone; if it costs
# the same, a request's wait only moves from the queue into a longer execution. Triton times
# every execution by its batch size, so the next cell prints the compute per image at each batch
# size that ran, and the verdict's reason reads it.

# %%
highest = f"{rates[-1]:g} req/s"
for name, sweep in (("no batching", without_batching), ("dynamic batching", with_batching)):
    run = sweep[highest]
    if run is None:
        continue
    per_image = run.triton_stats["compute_ms_per_inference_by_batch_size"]
    executions = run.triton_stats["executions_by_batch_size"]
    print(f"{name}, {highest}: compute per image, by batch size: " + ", ".join(
        f"{size}: {per_image[size]:.2f} ms ({executions[size]} executions)" for size in sorted(per_image)))
lab.record(triton_bench.batching_shortens_the_queue(without_batching, with_batching),
           predicted=predicted_batching_shortens_queue)
lab.record(triton_bench.batching_keeps_latency_flat(without_batching, with_batching, lab.hardware()),
           predicted=predicted_batching_flat);

# %% [markdown]
# ### The queueing view
#
# Queueing theory gives a baseline for the runs *without* batching. Model the server as one
# queue whose service time S is the inverse of the capacity measured above (the time per request
# of an instance that is never idle). With Poisson arrivals and a constant S, that is the M/D/1
# queue: the mean wait grows slowly at first and then sharply as the load approaches capacity.
# With evenly spaced arrivals (D/D/1), nobody waits at all below capacity. A request's time also
# varies, though: M/G/1 takes that variation into account, measured above as the squared
# coefficient of variation of a request's time alone. Each prediction is a request's time alone
# plus the predicted wait.

# %%
service_s, cv2 = onnx_capacity.service_time_s, onnx_capacity.service_cv2
alone_ms = onnx_capacity.alone.latency.mean_ms
measured_open = [result for result in (arrivals["constant"], *without_batching.values()) if result is not None]
print(f"{'rate':>10} | {'load':>4} | mean latency: measured, M/D/1, M/G/1 | Triton queue: measured, M/G/1 wait")
ratios = []
for name, result in without_batching.items():
    if result is None:
        continue
    md1_wait = 1000 * queueing.md1_mean_wait_s(result.rate_rps, service_s)
    mg1_wait = 1000 * queueing.mg1_mean_wait_s(result.rate_rps, service_s, cv2)
    ratios.append(result.latency.mean_ms / (alone_ms + mg1_wait))
    print(
        f"{name:>10} | {result.rate_rps * service_s:4.0%} | {result.latency.mean_ms:8.1f} ms, "
        f"{alone_ms + md1_wait:6.1f} ms, {alone_ms + mg1_wait:6.1f} ms | {result.server_ms('queue'):8.1f} ms, "
        f"{mg1_wait:6.1f} ms"
    )
plots.plot_queueing(measured_open, service_s, cv2=cv2, alone_ms=alone_ms)
plt.show()

# %% [markdown]
# How far the measurements sit from the model, and what this run measured that explains it:

# %%
outside_ms = alone_ms - onnx_capacity.alone.server_ms("compute_infer")
computes = [result.server_ms("compute_infer") for result in without_batching.values() if result is not None]
if ratios:
    side = "above" if np.mean(ratios) > 1 else "below"
    print(
        f"The measured mean latencies are {min(ratios):.2f} to {max(ratios):.2f} times the M/G/1 prediction "
        f"({np.mean(ratios):.2f} on average: {side} it). What this run measured about the difference:\n"
        f"- a request's time varies: its squared coefficient of variation is {cv2:.2f}, where M/D/1 assumes 0 "
        f"(M/G/1 uses it);\n"
        f"- of a request's {alone_ms:.1f} ms alone, {outside_ms:.1f} ms is spent outside Triton's compute infer "
        f"(moving the request's bytes, the server's own work around the model), while the model's service time "
        f"S = 1/capacity = {service_s * 1000:.1f} ms counts only what keeps the instance busy;\n"
        f"- the service time depends on the load, where both models take it as fixed: compute infer took "
        f"{min(computes):.1f} to {max(computes):.1f} ms per request in the Poisson runs, against "
        f"{onnx_capacity.saturated.server_ms('compute_infer'):.1f} ms while the capacity was measured "
        f"({onnx_capacity.saturated.concurrency} clients)."
    )
else:
    print("No queueing comparison: every Poisson run lacked a stable measurement.")

# %% [markdown]
# ## Wrapping up
#
# Every model goes back to its configuration as shipped, so the next person (or notebook) finds
# the server as it started:

# %%
lab.triton.restore_config("food_classifier_onnx")
lab.triton.restore_config("food_classifier")

# %% [markdown]
# All of this notebook's measurements, and the verdict on each expectation. The `name` column
# names the model and its configuration (instances, dynamic batching); `load` is the concurrency
# (closed loop) or the offered rate and arrival pattern (open loop). A tail percentile the run
# had too few requests for shows as n/a.

# %%
lab.table()
lab.verdicts();
# %% [markdown]
# Finally, the closed-loop runs side by side: latency percentiles (left) and throughput (right)
# against the number of clients, one colour per model and configuration.

# %%
plots.plot_latency_throughput_vs_concurrency(lab.results, title="Triton: latency and throughput vs concurrency")
plt.show()

# %% [markdown]
# ## Questions
#
# 1. For the Python-backend model, how did the queue and the compute change as clients were added,
#    and why?
# 2. Did more instances raise the throughput, and up to where? Use the instances' CPU to explain it.
# 3. Did dynamic batching keep the latency flat on this machine? Use the compute per image at each
#    batch size to explain why or why not.
#
# **Hand in:** the results table and the plots (batch sizes, queueing, latency and throughput;
# locally also the CPU per instance), with your predictions beside the verdicts.

# %% [markdown]
# In Docker, the project keeps running for the next notebooks; when you are done with the lab,
# download the notebooks with their outputs for your records, then bring it down on the Docker host:
#
# ```bash
# # runs on the Docker host (the node), in the repository clone
# docker compose down
# ```
#
# Locally, the next cell stops the services this notebook started (in Docker it does nothing:
# the containers keep running until you bring them down).

# %%
lab.stop()
