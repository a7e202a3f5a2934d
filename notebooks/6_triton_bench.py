# %% [markdown]
# # 6. Benchmarking Triton: queueing, instances, backends and dynamic batching
#
# In the previous notebook we brought up Triton and looked inside its model repository. Now we
# load it with traffic and watch where a request's time goes. Every experiment follows the same
# pattern: we state what we expect to see and why, measure it, and then check the expectation
# against this run's own numbers. Some expectations come from the GPU node this lab was written
# for and may not hold on a laptop's CPU; when one does not, the check says so and explains why.
#
# **Where things run.** On Chameleon, the Python cells run in the Jupyter container on the GPU
# node, next to the `triton_server` container they measure, and the shell commands run on the
# node host in your SSH session. On your own machine, every cell runs locally against a Triton
# server the notebook starts, CPU only.
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
# `lab.perf(...)` runs perf_analyzer with the window length of this notebook's profile (short
# windows in the `quick` profile used by the tests, longer ones in `full`), prints a one-line
# summary, and keeps every result for the table at the end.

# %%
# runs in the Jupyter container on the node (Chameleon) or on your machine (local)
import matplotlib.pyplot as plt
import requests

from servelab import plots, resources, triton_stats
from servelab.lab import Lab
from servelab.resources import ResourceSampler

lab = Lab.connect()

# %% [markdown]
# Three helpers of `lab` do the bookkeeping in every experiment below:
#
# - `lab.measure(model, ...)` runs perf_analyzer, and tries once more when it finds no stable
#   measurement; if no attempt settles, it says so and returns `None` instead of a number. Each
#   result is labelled with the model's current number of instances.
# - `lab.breakdown({...})` prints, for named runs, throughput, latency, and the two server-side
#   stages that matter here: time in Triton's queue and time computing (`compute infer`).
# - `lab.expect(claim, held, evidence)` records an expectation and this run's verdict on it, with
#   the numbers it was judged on; `lab.not_checked(claim, missing)` records one that could not be
#   judged because a run gave no number. All of them are listed at the end.

# %% [markdown]
# ## 1. The Python-backend model under concurrency
#
# `food_classifier` runs PyTorch inside Triton's Python backend, one instance, no dynamic
# batching: it executes one request at a time.
#
# **Expectation.** With one client, a request never waits: its latency is its compute time.
# With 8 or 16 clients, each request finds the others ahead of it, so it waits in Triton's
# queue for roughly (clients - 1) service times. The time spent *computing* each request should
# stay about the same; the time spent *queueing* should grow with the number of clients.

# %%
python_backend = {}
sampled = {}  # resource samples of the runs at concurrency 8, by number of instances
for concurrency in (1, 8, 16):
    with ResourceSampler() as sampler:
        python_backend[f"c={concurrency}"] = lab.measure("food_classifier", concurrency=concurrency)
    if concurrency == 8:
        sampled[lab.served_instances("food_classifier")] = sampler.series()
lab.breakdown(python_backend);
# %%
claim = "queueing delay grows with concurrency while compute infer stays about the same"
missing = [name for name, result in python_backend.items() if result is None]
if missing:
    lab.not_checked(claim, missing)
else:
    queue = [result.server_ms("queue") for result in python_backend.values()]
    infer = [result.server_ms("compute_infer") for result in python_backend.values()]
    queue_grows = queue[0] < queue[1] < queue[2]
    infer_similar = max(infer) <= 1.5 * min(infer)  # "about the same": within 50 %
    lab.expect(
        claim,
        held=queue_grows and infer_similar,
        evidence=", ".join(
            f"{name}: queue {q:.1f} ms, compute infer {i:.1f} ms"
            for name, q, i in zip(python_backend, queue, infer, strict=True)
        ),
        reason="perf_analyzer runs on the same few CPU cores as the server; at high concurrency its own "
        "work (and the stub's decoding of the images) competes with the model for the CPU, which "
        "stretches the compute time too",
    )

# %% [markdown]
# ### Batching on the client side
#
# Now one client sends batches of 16 images per request. `model.py` stacks them and runs
# MobileNetV2 once on the whole stack.
#
# **Expectation.** On a GPU, a batch of 16 costs little more time than a batch of 1: the GPU
# processes the 16 images in parallel, and a single image leaves most of it idle. So a batched
# request should take not much longer than a single one, and the images per second should jump.

# %%
batch_of_16 = lab.measure("food_classifier", concurrency=1, batch_size=16)
single = python_backend["c=1"]

claim = "a batch of 16 costs little more than a batch of 1 (less than twice the latency)"
if batch_of_16 is None or single is None:
    lab.not_checked(
        claim, [name for name, result in (("batch 16", batch_of_16), ("batch 1", single)) if result is None]
    )
else:
    ratio = batch_of_16.latency.mean_ms / single.latency.mean_ms
    lab.expect(
        claim,
        held=ratio < 2,
        evidence=f"one request of 16 images takes {batch_of_16.latency.mean_ms:.1f} ms, one of 1 image "
        f"{single.latency.mean_ms:.1f} ms ({ratio:.1f}x); throughput {batch_of_16.images_per_s:.1f} "
        f"images/s batched vs {single.images_per_s:.1f} images/s one at a time",
        reason="on a CPU the cores are already busy with one image (PyTorch spreads a single image over "
        "all of them), so 16 images cost about 16 times the work; decoding and preprocessing in "
        "model.py are per image too. Batching pays where the hardware has idle parallelism: a GPU",
    )

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
# `config.pbtxt`, and, on your own machine, how the local stack adapts it to the CPU: the same
# number of instances, as CPU instances. Triton then starts one Python process per instance.
#
# On Chameleon, run `nvidia-smi` on the node host afterwards: it lists a
# `triton_python_backend_stub` process per instance, two on each GPU. Keep `nvtop` running in
# your SSH session during the runs below, to watch GPU utilization: the Jupyter container
# has no access to the GPUs, so the resource plots here show its CPU and memory only.

# %%
two_per_gpu = [{"count": 2, "kind": "KIND_GPU", "gpus": [0]}, {"count": 2, "kind": "KIND_GPU", "gpus": [1]}]
lab.apply_config("food_classifier", lab.config("food_classifier").with_instance_groups(two_per_gpu))
print(f"Triton now runs {lab.served_instances('food_classifier')} instances of food_classifier")

with ResourceSampler() as sampler:
    four_instances = lab.measure("food_classifier", concurrency=8)
sampled[lab.served_instances("food_classifier")] = sampler.series()

# %% [markdown]
# Eight clients and four instances: each request should wait for less, as long as the
# hardware can actually run four forward passes at once. Let us push further, to four
# instances per GPU (eight in all):

# %%
four_per_gpu = [{"count": 4, "kind": "KIND_GPU", "gpus": [0]}, {"count": 4, "kind": "KIND_GPU", "gpus": [1]}]
lab.apply_config("food_classifier", lab.config("food_classifier").with_instance_groups(four_per_gpu))
print(f"Triton now runs {lab.served_instances('food_classifier')} instances of food_classifier")

with ResourceSampler() as sampler:
    eight_instances = lab.measure("food_classifier", concurrency=8)
sampled[lab.served_instances("food_classifier")] = sampler.series()

# %% [markdown]
# **Expectation.** Going from one instance to a few helps, because requests no longer wait for
# a single model. But each Python-backend instance is a whole Python process with its own
# PyTorch, its own decoding and preprocessing, and a copy of every tensor through shared
# memory; past some point more instances only fight over the same processors. On the original
# GPU node, eight instances were *worse* than four, with the GPUs still far from busy: the
# overhead of the Python backend, not the GPU, was the limit.
#
# On a machine with only a few CPU cores, expect this sooner: every instance is a process with
# its own PyTorch threads, and they all compete for the same cores. Runs can then become so
# slow and uneven that perf_analyzer's short windows (in the `quick` profile) never settle; the
# cells say so when that happens, and the comparison uses the runs that did produce a number.

# %%
scaling = {
    "1 instance, c=8": python_backend["c=8"],
    "4 instances, c=8": four_instances,
    "8 instances, c=8": eight_instances,
}
lab.breakdown(scaling)

claim = "more Python-backend instances stop helping (the most instances give no more than 5 % over fewer)"
fewer = {name: result for name, result in list(scaling.items())[:-1] if result is not None}
most_name, most = list(scaling.items())[-1]
if most is None or not fewer:
    lab.not_checked(claim, [name for name, result in scaling.items() if result is None])
else:
    best_fewer = max(result.throughput_rps for result in fewer.values())
    unmeasured = [name for name, result in scaling.items() if result is None]
    lab.expect(
        claim,
        held=most.throughput_rps <= 1.05 * best_fewer,
        evidence=", ".join(
            f"{name}: {result.throughput_rps:.1f} req/s, p50 {result.latency.p50_ms:.1f} ms"
            for name, result in [*fewer.items(), (most_name, most)]
        )
        + (f" ({', '.join(unmeasured)}: no stable measurement)" if unmeasured else ""),
        reason="the most instances still found idle processor time to use on this machine",
    )

# %% [markdown]
# What the machine was doing during each of these runs (in place of the original lab's nvtop
# screenshots). The thick line is all cores together, the thin ones each core; on this CPU-only
# run, the load generator's own work counts too, since it runs on the same machine.

# %%
for instances, series in sampled.items():
    summary = resources.summarize(series)
    print(
        f"{instances} instance(s), c=8: CPU mean {summary['cpu_percent_mean']}%, peak {summary['cpu_percent_max']}%; "
        f"GPU: {summary['gpus'] or series['gpu_source']}"
    )
    plots.plot_resources(series, title=f"food_classifier, {instances} instance(s), concurrency 8")
    plt.show()

# %% [markdown]
# Back to the configuration as shipped (one instance), before we move on:

# %%
lab.restore_config("food_classifier")

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
# Python-backend model: more requests per second and a lower latency.

# %%
onnx_single = lab.measure("food_classifier_onnx", concurrency=1)
python_single = python_backend["c=1"]

claim = "the ONNX Runtime model beats the Python-backend model at concurrency 1"
if onnx_single is None or python_single is None:
    lab.not_checked(
        claim, [name for name, result in (("ONNX c=1", onnx_single), ("Python c=1", python_single)) if result is None]
    )
else:
    lab.expect(
        claim,
        held=onnx_single.throughput_rps > python_single.throughput_rps,
        evidence=f"ONNX: {onnx_single.throughput_rps:.1f} req/s, mean {onnx_single.latency.mean_ms:.1f} ms "
        f"(compute infer {onnx_single.server_ms('compute_infer'):.1f} ms); Python backend: "
        f"{python_single.throughput_rps:.1f} req/s, mean {python_single.latency.mean_ms:.1f} ms "
        f"(compute infer {python_single.server_ms('compute_infer'):.1f} ms)",
        reason="locally the ONNX model also runs behind the Python backend, and each of its requests "
        "carries 600 KB of float32 pixels instead of a compressed JPEG",
    )

# %% [markdown]
# ### Scaling the ONNX model
#
# The original lab then gave the ONNX model two instances on each of the two GPUs, with one
# group `count: 2`, `gpus: [ 0, 1 ]` (for a GPU group, `count` is per listed GPU: four instances
# in all). Locally that group becomes two CPU instances. Then we load it with 8 and with 16
# clients.

# %%
two_on_each_gpu = [{"count": 2, "kind": "KIND_GPU", "gpus": [0, 1]}]
lab.apply_config("food_classifier_onnx", lab.config("food_classifier_onnx").with_instance_groups(two_on_each_gpu))
print(f"Triton now runs {lab.served_instances('food_classifier_onnx')} instances of food_classifier_onnx")

onnx_scaled = {
    "c=1 (1 instance)": onnx_single,
    "c=8": lab.measure("food_classifier_onnx", concurrency=8),
    "c=16": lab.measure("food_classifier_onnx", concurrency=16),
}
lab.breakdown(onnx_scaled);
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
# **On Chameleon**, switch the `flask` container to the ONNX model on the node host. Name the
# service (`flask`) and pass `--no-deps`, so that Compose recreates only that container and not
# the Jupyter container this notebook runs in:
#
# ```bash
# # runs on node-serve-system
# FOOD11_MODEL_NAME=food_classifier_onnx docker compose -f docker/docker-compose-triton.yaml up -d --no-deps flask
# ```
#
# Then upload a photo at `http://A.B.C.D` again. **Locally**, the next cell starts a second
# GourmetGram pointed at the ONNX model. Either way, the cell asks the UI which backend it uses
# and uploads a photo to it, as a browser would.

# %%
onnx_ui = lab.ui("food_classifier_onnx")
health = requests.get(f"{onnx_ui}/healthz", timeout=10).json()
print(
    f"GourmetGram at {onnx_ui}: backend {health['backend']!r}, model {health['model']!r}, weights {health['weights']}"
)
if health["model"] != "food_classifier_onnx":
    print(
        "This UI still talks to another model: run the docker compose command above on the node, then this cell again."
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
# The original lab used 120, 180, 240 and 300 requests per second, chosen for a P100 GPU. On a
# slower machine those rates would simply overload the server, so `lab.scale_rates` measures
# this machine's capacity and scales the four rates down in proportion, keeping the experiment's
# shape (from light load up to near saturation). On Chameleon they are used unchanged.
#
# In open-loop mode the throughput just follows the rate we chose, so we look at latency only.
#
# **Expectation.** At the same average rate, Poisson arrivals queue more than evenly spaced
# ones: with even spacing each request finds the previous one finished, while random spacing
# produces clumps that have to wait.

# %%
lab.restore_config("food_classifier_onnx")
rates = lab.scale_rates([120, 180, 240, 300])

arrivals = {
    distribution: lab.measure("food_classifier_onnx", rate=rates[0], distribution=distribution)
    for distribution in ("constant", "poisson")
}
lab.breakdown(arrivals);
claim = "Poisson arrivals queue more than constant arrivals at the same average rate"
missing = [name for name, result in arrivals.items() if result is None]
if missing:
    lab.not_checked(claim, missing)
else:
    constant, poisson = arrivals["constant"], arrivals["poisson"]
    lab.expect(
        claim,
        held=poisson.server_ms("queue") > constant.server_ms("queue"),
        evidence=f"at {rates[0]:g} req/s, server queue {poisson.server_ms('queue'):.2f} ms (Poisson) vs "
        f"{constant.server_ms('queue'):.2f} ms (constant); p95 latency {poisson.latency.p95_ms:.1f} ms vs "
        f"{constant.latency.p95_ms:.1f} ms",
        reason="at this light load clumps are rare, and the load generator, sharing the CPU with the server, "
        "cannot keep its constant schedule exactly either",
    )

# %% [markdown]
# ## 6. Dynamic batching
#
# More instances would absorb the bursts, but would sit idle between them. Dynamic batching
# uses the idle capacity inside one instance instead: when the instance finishes an
# execution and finds several requests waiting, Triton hands them all to it as one batch.
# A request that arrives in a clump then waits for about one execution, not for all the
# requests ahead of it one by one.
#
# First, the baseline: Poisson arrivals at each of the four rates *without* dynamic batching.
# Around each run we read Triton's statistics (`/v2/models/food_classifier_onnx/stats`) before
# and after, which tell us how many executions ran at each batch size.


# %%
def poisson_sweep() -> dict:
    """Poisson runs at every rate, each with the server's statistics over that run."""
    sweep = {}
    for rate in rates:
        with triton_stats.measure(lab.triton_http, "food_classifier_onnx") as stats:
            result = lab.measure("food_classifier_onnx", rate=rate, distribution="poisson")
        if result is not None:
            result.triton_stats = stats.delta.to_dict()
        sweep[f"{rate:g} req/s"] = (result, stats.delta)
        print(
            f"    server: {stats.delta.inference_count} inferences in {stats.delta.execution_count} executions "
            f"(average batch {stats.delta.avg_batch_size:.2f})"
        )
    return sweep


without_batching = poisson_sweep()
lab.breakdown({name: result for name, (result, _) in without_batching.items()});
# %% [markdown]
# Now we turn dynamic batching on. The block we add says: batches of 4, 6 or 8 are preferred,
# and a request may be held back for at most 100 microseconds waiting for others to join its
# batch. Then the same four runs:

# %%
batching = lab.config("food_classifier_onnx").with_dynamic_batching(
    preferred_batch_size=[4, 6, 8], max_queue_delay_microseconds=100
)
lab.apply_config("food_classifier_onnx", batching)
print("dynamic_batching in the served config:", lab.served_config("food_classifier_onnx").get("dynamic_batching"))

with_batching = poisson_sweep()
lab.breakdown({name: result for name, (result, _) in with_batching.items()});
# %% [markdown]
# How many executions ran at each batch size? Every client sent a single image per request, so
# any execution with a batch larger than 1 was formed by the server:

# %%
batch_histograms = {f"{name}, dynamic batching": delta for name, (_, delta) in with_batching.items()}
highest = f"{rates[-1]:g} req/s"
batch_histograms[f"{highest}, no dynamic batching"] = without_batching[highest][1]
plots.plot_batch_sizes(batch_histograms, title="food_classifier_onnx: executions per batch size (Poisson arrivals)")
plt.show()

# %% [markdown]
# **Expectation.** Without dynamic batching, latency climbs steeply as the rate approaches
# capacity, because the clumps of a Poisson process queue up one behind another. With dynamic
# batching, latency stays nearly flat: whatever clump has formed is served in one execution. We
# compare how much the mean latency grows from the lowest rate to the highest, with and without.

# %%
claim = (
    "dynamic batching keeps latency flat as the rate rises (mean latency grows less than "
    "without batching, and by at most 1.5x from the lowest rate to the highest)"
)
lowest = f"{rates[0]:g} req/s"
ends = {
    f"{label}, {name}": sweep[name][0]
    for label, sweep in (("without", without_batching), ("with", with_batching))
    for name in (lowest, highest)
}
missing = [name for name, result in ends.items() if result is None]
if missing:
    lab.not_checked(claim, missing)
else:
    growth = {
        label: sweep[highest][0].latency.mean_ms / sweep[lowest][0].latency.mean_ms
        for label, sweep in (("without", without_batching), ("with", with_batching))
    }
    lab.expect(
        claim,
        held=growth["with"] < growth["without"] and growth["with"] <= 1.5,
        evidence=", ".join(
            f"{label} batching: {sweep[lowest][0].latency.mean_ms:.1f} ms at {lowest} -> "
            f"{sweep[highest][0].latency.mean_ms:.1f} ms at {highest} ({growth[label]:.2f}x)"
            for label, sweep in (("without", without_batching), ("with", with_batching))
        ),
        reason="on a CPU, a batch of 8 images costs about 8 times the work of one, so serving a clump as a "
        "batch saves only the per-request overhead, not the compute; the CPU is saturated per image. "
        "On a GPU, a batch costs little more than a single image, and batching pays",
    )

# %% [markdown]
# ### The queueing view
#
# Queueing theory gives a baseline for the runs *without* batching. Model the server as one
# queue with a fixed service time S, the compute time we measured with a single client. With
# Poisson arrivals, that is the M/D/1 queue: the mean wait grows slowly at first and then
# sharply as the load approaches capacity (1/S requests per second). With evenly spaced arrivals
# (D/D/1), nobody waits at all below capacity. The measured latencies also include moving each
# request's 600 KB across the network stack, so expect them to sit somewhat above the curves.

# %%
open_loop_without_batching = [arrivals["constant"]] + [result for result, _ in without_batching.values()]
open_loop_without_batching = [result for result in open_loop_without_batching if result is not None]
if onnx_single is None or not open_loop_without_batching:
    print("No queueing plot: the single-client run or every open-loop run lacks a stable measurement.")
else:
    service_time_s = onnx_single.server_breakdown["server_compute_infer_us"] / 1e6
    print(
        f"service time S = compute infer at concurrency 1 = {service_time_s * 1000:.1f} ms "
        f"-> capacity 1/S = {1 / service_time_s:.1f} req/s"
    )
    plots.plot_queueing(open_loop_without_batching, service_time_s)
    plt.show()

# %% [markdown]
# ## Wrapping up
#
# Every model goes back to its configuration as shipped, so the next person (or notebook) finds
# the server as it started:

# %%
lab.restore_config("food_classifier_onnx")
lab.restore_config("food_classifier")

# %% [markdown]
# All of this notebook's measurements, and the verdict on each expectation. The `target` column
# names the model and how many instances served it; `load` is the concurrency (closed loop) or
# the offered rate and arrival pattern (open loop).

# %%
lab.table()
lab.verdicts();
# %% [markdown]
# Finally, the closed-loop runs side by side: latency percentiles (left) and throughput (right)
# against the number of clients, one colour per model and instance count.

# %%
plots.plot_latency_throughput_vs_concurrency(lab.results, title="Triton: latency and throughput vs concurrency")
plt.show()

# %% [markdown]
# On Chameleon, when you are done, download this notebook with its outputs for your records,
# then bring the services down on the node host:
#
# ```bash
# # runs on node-serve-system
# docker compose -f docker/docker-compose-triton.yaml down
# ```
#
# Locally, the next cell stops the services this notebook started (on Chameleon it does
# nothing: the containers keep running until you bring them down).

# %%
lab.stop()
