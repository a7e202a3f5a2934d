# %% [markdown]
# # 6. Benchmarking Triton: queueing and instances
#
# Where does a request's time go when Triton is loaded, and what do more instances of a model buy?
# Each experiment states an expectation, measures, and checks it against this run's numbers. In
# Docker, cells run in the Jupyter container beside `triton`; without Docker, against a local
# CPU-only Triton. Notebook 7 goes on with the ONNX Runtime backend, bursty arrivals and dynamic
# batching.
#
# `perf_analyzer`, Triton's load generator, runs here **closed loop** (`concurrency`: N clients,
# each sending when its last answer arrives). Triton reports where each request spent its time:
# **queue** (waiting for a free model **instance**, a copy of the model that runs one request at a
# time) and **compute infer** (running the model). A check's condition whose premise did not
# arise is NOT CHECKED.

# %%
# runs in the Jupyter container (Docker) or on your machine (local)
import shutil
import subprocess

import matplotlib.pyplot as plt
import tritonclient.http as triton_http

from servelab.lab import Lab, plots
from servelab.lessons import triton_bench

lab = Lab.connect("6_triton_bench")
# Triton's own client; loading several instances can take minutes on a busy CPU, hence the long timeout.
triton = triton_http.InferenceServerClient(lab.triton_http, network_timeout=600)

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
lab.record(triton_bench.queueing_grows(sweep), predicted=predicted_queue_at_16_ms)
lab.record(triton_bench.queue_is_the_clients_ahead(sweep), predicted=predicted_clients_ahead)
print(triton_bench.device_use(python_backend, sweep=True))

# %% [markdown]
# **Your turn.** Type a perf_analyzer command, as in a terminal, at a concurrency of your choice.
# The lab adds its Triton (`-u`) and a report file (`-f`); a line it won't run says what to change,
# and so does one with an option perf_analyzer would ignore beside the others.

# %%
# Your turn: my_command = "perf_analyzer ...", a line for the model food_classifier at a concurrency
#   of your choice, in windows of 20 requests each (flags: -m, --concurrency-range, and
#   --measurement-request-count, which counts only with --measurement-mode count_windows: Triton's
#   perf_analyzer CLI guide).
### BEGIN SOLUTION
my_command = (
    "perf_analyzer -m food_classifier --concurrency-range 4 --measurement-mode count_windows "
    "--measurement-request-count 20"
)
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
lab.record(triton_bench.client_batching(python_backend["c=1"], batch_of_16), predicted=predicted_batch_gain);

# %% [markdown]
# That helps only a client with 16 images. For one photo per user: more instances, or server batches.
#
# ## 2. More instances of the Python-backend model
#
# Triton reads a model's `config.pbtxt` in its model repository (`lab.repository`) when the model
# loads. The file this Triton reads:

# %%
config_file = lab.repository / "food_classifier" / "config.pbtxt"
as_staged = config_file.read_text()  # kept, to put back at the end
print(as_staged)

# %% [markdown]
# **Your turn.** Type an `instance_group` with two instances on each of the GPU node's two GPUs.
# `lab.triton.configs.write_config` writes it into that file in place of the group there, after checking
# it against Triton's schema (it names a misspelt field); without a GPU it writes as many CPU
# instances. It prints the file as Triton will read it. Then `load_model` (Triton's model-control
# API) makes Triton reread the file: it starts the new instances, then retires the old, and its
# config endpoint (`get_model_config`) says what it runs.

# %%
predicted_speedup = None  # before you run: how many times the requests per second of 1 instance 4 serve (a number)


# %%
def load(model: str) -> int:
    """Triton rereads `model`'s config.pbtxt; what it now runs, as it reports it; the instances."""
    triton.load_model(model)
    groups = triton.get_model_config(model)["instance_group"]
    for group in groups:
        print(f"Triton runs {group['name']}: {group['count']} x {group['kind']}, GPUs {group['gpus']}")
    return sum(group["count"] * max(1, len(group["gpus"])) for group in groups)  # count is per listed GPU


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
lab.triton.configs.write_config(config_file, two_per_gpu)
more_instances = load("food_classifier")
by_instances = {1: python_backend["c=8"], more_instances: lab.triton.perf("food_classifier", concurrency=8)}

# %% [markdown]
# Now four instances on each GPU, eight in all:

# %%
# Your turn: four_per_gpu = "instance_group [ ... ]", four instances on each of GPUs 0 and 1 (the
#   fields as above).
### BEGIN SOLUTION
four_per_gpu = "instance_group [ { count: 4, kind: KIND_GPU, gpus: [ 0 ] }, { count: 4, kind: KIND_GPU, gpus: [ 1 ] } ]"
### END SOLUTION
lab.triton.configs.write_config(config_file, four_per_gpu)
most_instances = load("food_classifier")

# %% [markdown]
# On a GPU, `nvidia-smi` reads each GPU once a second beside this run: `utilization.gpu` is the
# share of that second in which the GPU ran a kernel (near 100% on both: the instances keep them
# busy), and `memory.used` grows with each instance's copy of the model.

# %%
smi = None
if shutil.which("nvidia-smi"):
    query = ["--query-gpu=timestamp,index,utilization.gpu,memory.used", "--format=csv", "--loop=1"]
    smi = subprocess.Popen(["nvidia-smi", *query], stdout=subprocess.PIPE, text=True)
else:
    print("No nvidia-smi in this machine or container: it has no NVIDIA GPU, or not its driver's tools (the groups "
          "Triton printed above say where the instances run). How busy more instances keep a GPU only a GPU can "
          "show: on the GPU node, this cell prints each GPU's use every second of the run.")
by_instances[most_instances] = lab.triton.perf("food_classifier", concurrency=8)
if smi:
    smi.terminate()
    print(smi.communicate()[0])

# %% [markdown]
# **Expectation.** More instances help while the hardware has idle capacity; once it is busy,
# they take turns. On a CPU, one instance leaves cores waiting (it decodes on one; its inference
# threads wait for each other at every layer); several each run a request on a core. So:
#
# 1. from one instance to four, throughput rises by more than the noise between two runs;
# 2. eight do no better than four (within that noise).
#
# Locally, the plot stacks each instance's CPU against every core busy (dashed); in Docker the
# instances run in Triton's container, out of this notebook's sight, and the cell says so.

# %%
scaling = {f"{count} instance{'s' * (count > 1)}": run for count, run in sorted(by_instances.items())}
lab.breakdown(scaling)
print(triton_bench.device_use(scaling))
lab.record(triton_bench.instances_stop_helping(by_instances), predicted=predicted_speedup)
plots.plot_process_cpu(scaling, title="food_classifier at 8 clients: CPU of each instance")
plt.show()

# %% [markdown]
# Back to one instance: the file as it was, loaded again.

# %%
config_file.write_text(as_staged)
load("food_classifier");

# %% [markdown]
# ## Wrapping up
#
# All runs, then the verdicts.

# %%
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
# 2. Did 16 images per request pay? Use the forward pass's time on 16 and on 1 to explain.
# 3. Did more instances raise the throughput, and up to where? Why?
#
# **Hand in:** the results table and the plots, with your predictions beside the verdicts.

# %% [markdown]
# Locally, the next cell stops the services this notebook started (in Docker it does nothing:
# Triton stays up).

# %%
lab.stop()
