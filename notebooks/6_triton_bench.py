# %% [markdown]
# # 6. Benchmarking Triton: queueing, instances, backends and dynamic batching
#
# **Time:** about 36 minutes (6 reading, 9 running, 21 hands-on; `python -m servelab.time_plan`)
#
# Where does a request's time go when Triton is loaded? Each experiment states an expectation,
# measures, and checks it against this run's numbers. In Docker, cells run in the Jupyter
# container beside `triton`; without Docker, against a local CPU-only Triton.
#
# `perf_analyzer`, Triton's load generator, runs **closed loop** (`concurrency`: N clients, each
# sending when its last answer arrives) or **open loop** (`rate`: requests at an average rate,
# evenly spaced, `constant`, or random, `poisson`). Triton reports where each request spent its time:
# **queue** (waiting for a free model instance) and **compute infer** (running the model). A
# check's condition whose premise did not arise is NOT CHECKED.

# %%
# runs in the Jupyter container (Docker) or on your machine (local)
import matplotlib.pyplot as plt
import requests

from servelab.lab import Lab
from servelab.lessons import triton_bench
from servelab.report import plots

lab = Lab.connect("6_triton_bench")

# %% [markdown]
# ## 1. The Python-backend model under concurrency
#
# `food_classifier` runs PyTorch in Triton's Python backend: one instance, one request at a time.
#
# **Expectation.** With c clients, a request finds the other c - 1 ahead of it, so:
#
# 1. the queue grows with the clients (1 to 8, 8 to 16: each by more than one compute time),
#    while compute infer stays within 50% of its lowest;
# 2. at each c above 1, the queue is about (c - 1) compute times.
#
# Where Triton held under two requests at a time, nothing could queue: NOT CHECKED.

# %%
predicted_queue_at_16_ms = None  # before you run: the time a request waits in Triton's queue at 16 clients, in ms
predicted_clients_ahead = None  # and True if at c clients the queue is about (c - 1) compute times, else False

# %%
python_backend = {f"c={c}": lab.triton.perf("food_classifier", concurrency=c, triton_stats=True) for c in (1, 8, 16)}
lab.breakdown(python_backend);

# %% [markdown]
# The last line reads the device (GPU, else the instances' CPU): latency growing while it is not
# full waits for the instance, so add instances.

# %%
sweep = {c: python_backend[f"c={c}"] for c in (1, 8, 16)}
lab.record(triton_bench.queueing_grows(sweep, lab.hardware(), lab.cores), predicted=predicted_queue_at_16_ms)
lab.record(triton_bench.queue_is_the_clients_ahead(sweep, lab.hardware()), predicted=predicted_clients_ahead)
print(triton_bench.device_use(python_backend, lab.cores, sweep=True))

# %% [markdown]
# **Your turn.** Type a perf_analyzer command, as in a terminal, at a concurrency of your choice.
# The lab adds its Triton (`-u`) and a report file (`-f`); a line it won't run says what to change.

# %%
# Your turn: my_command = "perf_analyzer ...", a line for the model food_classifier at a concurrency
#   of your choice (flags: -m, --concurrency-range, --measurement-request-count: Triton's perf_analyzer CLI guide).
### BEGIN SOLUTION
my_command = "perf_analyzer -m food_classifier --concurrency-range 4 --measurement-request-count 20"
### END SOLUTION
typed_runs = lab.triton.perf_typed(my_command)
if typed_runs:
    lab.table(typed_runs)

# %% [markdown]
# ### Batching on the client side
#
# One client now sends 16 images per request; `model.py` decodes them one by one, then runs
# MobileNetV2 once on the stack, and times both (Triton's compute infer holds the two).
#
# **Expectation.** On a GPU, 16 images cost little more than 1, since one leaves it mostly idle:
#
# 1. the forward pass on 16 images takes under twice its time on 1;
# 2. so the client gets more images per second.

# %%
predicted_batch_gain = None  # before you run: how many times the images per second of 1 image per request
# one client gets with 16 per request (a number)

# %%
batch_of_16 = lab.triton.perf("food_classifier", concurrency=1, batch_size=16, triton_stats=True)
lab.breakdown({"1 image per request": python_backend["c=1"], "16 images per request": batch_of_16})
lab.record(triton_bench.client_batching(python_backend["c=1"], batch_of_16, lab.hardware(), lab.cores),
           predicted=predicted_batch_gain);

# %% [markdown]
# That helps only a client with 16 images. For one photo per user: more instances, or server batches.
#
# ## 2. More instances of the Python-backend model
#
# The config as shipped:

# %%
shipped = lab.triton.config("food_classifier")
print(shipped)

# %% [markdown]
# **Your turn.** Type an `instance_group` with two instances on each of the GPU node's two GPUs.
# `with_text` replaces that field of the shipped text and names a misspelt field. Without a GPU,
# the lab runs as many CPU instances (the printout shows it).

# %%
predicted_speedup = None  # before you run: how many times the requests per second of 1 instance 4 serve (a number)

# %%
# Your turn: two_per_gpu = """instance_group [ ... ]""", two instances on GPU 0 and two on GPU 1
#   (a group's fields: count, kind (KIND_GPU or KIND_CPU), gpus; how: `config.pbtxt` as printed above,
#   and Triton's model configuration guide, "Instance Groups").
### BEGIN SOLUTION
two_per_gpu = """
instance_group [
  { count: 2, kind: KIND_GPU, gpus: [ 0 ] },
  { count: 2, kind: KIND_GPU, gpus: [ 1 ] }
]
"""
### END SOLUTION
lab.triton.apply_config("food_classifier", shipped.with_text(two_per_gpu))
more_instances = lab.triton.served_instances("food_classifier")
by_instances = {1: python_backend["c=8"], more_instances: lab.triton.perf("food_classifier", concurrency=8)}

# %% [markdown]
# Now four instances on each GPU, eight in all:

# %%
# Your turn: four_per_gpu = "instance_group [ ... ]", four instances on each of GPUs 0 and 1 (the
#   fields as above).
### BEGIN SOLUTION
four_per_gpu = "instance_group [ { count: 4, kind: KIND_GPU, gpus: [ 0 ] }, { count: 4, kind: KIND_GPU, gpus: [ 1 ] } ]"
### END SOLUTION
lab.triton.apply_config("food_classifier", shipped.with_text(four_per_gpu))
most_instances = lab.triton.served_instances("food_classifier")
by_instances[most_instances] = lab.triton.perf("food_classifier", concurrency=8)

# %% [markdown]
# **Expectation.** More instances help while the hardware has idle capacity; once it is busy,
# they take turns. On a CPU, one instance leaves cores waiting (it decodes on one; its inference
# threads wait for each other at every layer); several each run a request on a core. So:
#
# 1. from one instance to four, throughput rises by more than the noise between two runs;
# 2. eight do no better than four (within that noise).
#
# Locally, the plot stacks each instance's CPU against every core busy (dashed).

# %%
scaling = {f"{count} instance{'s' * (count > 1)}": run for count, run in sorted(by_instances.items())}
lab.breakdown(scaling)
print(triton_bench.device_use(scaling, lab.cores))
lab.record(triton_bench.instances_stop_helping(by_instances, lab.hardware(), lab.cores), predicted=predicted_speedup)
if not lab.on_compose:
    plots.plot_process_cpu(scaling, lab.cores, title="food_classifier at 8 clients: CPU of each instance")
    plt.show()
lab.triton.restore_config("food_classifier")  # back to one instance, as shipped

# %% [markdown]
# ## 3. The ONNX Runtime backend
#
# `food_classifier_onnx` runs the exported graph on Triton's ONNX Runtime backend; the client
# preprocesses, and perf_analyzer sends random `[3, 224, 224]` tensors. (Locally, the Python
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
python_single = python_backend["c=1"]
lab.record(triton_bench.onnx_beats_python(onnx_single, python_single,
                                          lab.triton.served_config("food_classifier_onnx").get("backend") == "python",
                                          lab.hardware()), predicted=predicted_onnx_speedup);

# %% [markdown]
# ### Scaling the ONNX model
#
# The original lab typed `count: 2` on `gpus: [ 0, 1 ]`: `count` is per listed GPU, so four
# instances (locally, two CPU instances).
#
# **Expectation.** At 8 clients, the larger group serves more requests per second than one
# instance, as long as one left hardware idle.

# %%
onnx_shipped = lab.triton.config("food_classifier_onnx")
print(onnx_shipped)

# %%
predicted_onnx_instances = None  # before you run: how many times the requests/s of 1 the larger group serves (x)

# %%
onnx_one_busy = lab.triton.perf("food_classifier_onnx", concurrency=8)
two_on_each_gpu = "instance_group [ { count: 2, kind: KIND_GPU, gpus: [ 0, 1 ] } ]"
lab.triton.apply_config("food_classifier_onnx", onnx_shipped.with_text(two_on_each_gpu))
onnx_instances = lab.triton.served_instances("food_classifier_onnx")
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
# At 16 clients, compare queue with compute: a longer queue means the instances are saturated.
#
# ## 4. The web UI with client-side pre- and post-processing
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
# ## 5. Bursty arrivals: constant vs Poisson
#
# Users arrive on their own schedule, sometimes in clumps. One ONNX instance, open loop. The
# original lab's rates suited its two P100 GPUs, so `lab.triton.capacity` measures one instance's
# capacity here and `lab.triton.scale_rates` keeps the rates' shares of it.
#
# **Expectation.** At the same average rate, Poisson arrivals queue more than evenly spaced ones:
# a longer wait in Triton's queue (by over a tenth of a compute time) and a p95 over 10% longer.
# Where neither run queued: NOT CHECKED.

# %%
predicted_poisson_queue_ms = None  # before you run: a request's wait in Triton's queue, Poisson arrivals (ms)

# %%
lab.triton.restore_config("food_classifier_onnx")
onnx_capacity = lab.triton.capacity("food_classifier_onnx")
rates = lab.triton.scale_rates([120, 180, 240, 300], onnx_capacity)

arrivals = {
    distribution: lab.triton.perf("food_classifier_onnx", rate=rates[0], distribution=distribution)
    for distribution in ("constant", "poisson")
}
lab.breakdown(arrivals)
lab.record(triton_bench.poisson_queues_more(arrivals["constant"], arrivals["poisson"], rates[0], onnx_capacity.rps,
                                            lab.hardware(), lab.cores), predicted=predicted_poisson_queue_ms);

# %% [markdown]
# ## 6. Dynamic batching
#
# Dynamic batching sends requests waiting in Triton's queue to the instance as one batch, one
# execution: a request in a clump waits for about one execution. Triton forms the largest
# `preferred_batch_size` it can (else any size up to `max_batch_size`), and
# `max_queue_delay_microseconds` holds a request that long for others to join.
#
# First the baseline, without batching, with Triton's executions by batch size.

# %%
predicted_queue_share = None  # before you run: the queue wait at the highest rate with batching, over without (x)
predicted_latency_growth = None  # and the growth of the mean latency with batching, lowest rate to highest (x)

# %%
without_batching = triton_bench.poisson_sweep(lab.triton.perf, rates)
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
lab.triton.apply_config("food_classifier_onnx", onnx_shipped.with_text(batching))
with_batching = triton_bench.poisson_sweep(lab.triton.perf, rates)
lab.breakdown(with_batching);

# %% [markdown]
# Clients sent one image per request, so any larger batch was formed by the server. Below the
# plot: the compute per image at each batch size, at the highest rate.

# %%
histograms, costs = triton_bench.batches_ran(without_batching, with_batching)
plots.plot_batch_sizes(histograms, share=True, title="food_classifier_onnx: inferences by batch size executed")
plt.show()
print(costs)

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
lab.record(triton_bench.batching_keeps_latency_flat(without_batching, with_batching, lab.hardware()),
           predicted=predicted_latency_growth);

# %% [markdown]
# ### The queueing view
#
# Kendall's notation names a queue arrivals/service/servers: M is Poisson (memoryless) arrivals,
# D a deterministic service time, G a general one. With S = 1 / the measured capacity, the runs
# without batching are an M/D/1 queue: the wait grows slowly, then sharply near capacity. M/G/1
# adds how much a request's time varies. Each model's estimate adds the wait to a request's time alone.

# %%
print(triton_bench.queueing_view(without_batching, onnx_capacity))
open_loop = [result for result in (arrivals["constant"], *without_batching.values()) if result is not None]
plots.plot_queueing(open_loop, onnx_capacity.service_time_s, cv2=onnx_capacity.service_cv2,
                    alone_ms=onnx_capacity.alone.latency.mean_ms)
plt.show()

# %% [markdown]
# ## Wrapping up
#
# The models go back to their shipped configs; then all runs and the verdicts.

# %%
lab.triton.restore_config("food_classifier_onnx")
lab.triton.restore_config("food_classifier")
lab.table()
lab.verdicts();

# %% [markdown]
# The closed-loop runs: latency and throughput against clients.

# %%
plots.plot_latency_throughput_vs_concurrency(lab.results, title="Triton: latency and throughput vs concurrency")
plt.show()

# %% [markdown]
# ## Questions
#
# 1. As clients were added, how did the queue and the compute change, and how busy was the device?
# 2. Did more instances raise the throughput, and up to where? Why?
# 3. Did dynamic batching keep the latency flat here? Use the compute per image to explain.
#
# **Hand in:** the results table and the plots, with your predictions beside the verdicts.

# %% [markdown]
# Part 1 ends here. On the node, save this notebook, then run notebook 2's last cell (Chameleon's
# Jupyter): it copies your work off. Locally, the next cell stops the services. Next:
# `8_io_vs_compute.ipynb`.

# %%
lab.stop()
