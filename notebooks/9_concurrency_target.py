# %% [markdown]
# # 9. The concurrency target, and replicas that come and go: Ray Serve
#
# Notebook 8 limited the work *inside* one server: its **predict slots** (`PREDICT_CONCURRENCY`), the
# inferences it runs at once. A platform running **replicas** (copies of the model's service, each with
# a share of the machine) adds limits *in front* of them:
#
# - the **concurrency target**: the most requests sent to one replica at once; the rest wait in a
#   **queue** in front;
# - the queue's **bound**: past it, requests are refused at once (HTTP 503);
# - the **autoscaler**: it adds replicas while the load per replica exceeds a target, and removes
#   them when the load drops.
#
# On **Ray Serve**, a **deployment** (an app and its replicas) sits behind Serve's **proxy**, the
# process that receives HTTP requests and routes them to replicas. Two rules:
#
# 1. **What triggers scaling.** Baseten's concurrency target is one number: it caps a replica, and a
#    replica is added once all are full. Ray Serve splits it into `max_ongoing_requests` (the **cap**)
#    and `target_ongoing_requests` (the **target**). A target below the cap (Ray's practice) adds a
#    replica before any is full; at the cap, Serve follows Baseten's rule.
# 2. **The cap must be at least the predict slots**, or slots idle while requests wait in front.
#
# The deployment's other options, in `ray_serve/serve_config.yaml`: `max_queued_requests` (the
# bound; -1: none), `autoscaling_config` (the target, replica counts, delays), `ray_actor_options`
# (the GPU, or without one the cores, a replica reserves). Each replica runs `fastapi_onnx`'s app.

# %%
import json
import statistics

import requests

from servelab.lab import Lab
from servelab.lessons import concurrency_target

lab = Lab.connect("9_concurrency_target")
serve = lab.ray_serve()
print(f"Ray Serve at {serve.url}; its Ray has {serve.hardware.describe()}.")

# %% [markdown]
# ## The config as shipped
#
# Each edit below prints its difference from this file.

# %%
print(serve.config_file.read_text())

# %% [markdown]
# One request: its answer names the Ray node and replica that served it (`X-Ray-Node`,
# `X-Serve-Replica`); `/health` gives the replica's limits.

# %%
serve.restore()
answer = serve.predict()  # POST /predict with the sample photo, as to FastAPI
print(f"HTTP {answer.status_code}: {answer.json()}")
print(f"served by replica {answer.headers['x-serve-replica']} on node {answer.headers['x-ray-node'][:12]}...")
print(requests.get(f"{serve.url}/health", timeout=10).json())

# %% [markdown]
# ## A step load, watched from both sides
#
# One or two replicas, each with a cap of 4 and one predict slot; the target is 1.5 requests per
# replica. Short delays (`look_back_period_s`, `metrics_interval_s`) let Serve act within a step.
#
# Steps of 1 client, 3 (above the target, below the cap), 12 (above both), then 1. Every second the
# notebook samples Serve: replicas, requests inside them and queued in front, time in a replica, CPU.
#
# **Expectation**:
#
# 1. 1 client: one replica. 3 clients: above the target, the replica not full, nothing queued, yet
#    Serve adds a replica: the target triggers it. Back at 1 client, Serve removes it.
# 2. 12 clients: requests queue in front (a queued request takes the first replica with room), and a
#    client's latency clearly exceeds its time in a replica. With 1 client, the time outside the
#    replica (the proxy's) is under a quarter of that with 12.

# %%
predicted_scales_on_target = None  # before you run: True if 3 clients bring a 2nd replica while the first
# is not full, and it goes once the load drops, else False
predicted_queue_in_front = None  # and True if with 12 clients requests wait in front of the replicas, else False
MAX_ONGOING, TARGET, BETWEEN = 4, 1.5, 3  # BETWEEN: clients above the target, below the cap
# Your turn: autoscaling = {...}, Serve's autoscaling_config: the target TARGET, 1 to 2 replicas, a
#   replica added after 2 s above it and removed after 5 s below, load averaged over 4 s and sampled
#   every second (fields: target_ongoing_requests, min_replicas, max_replicas, upscale_delay_s,
#   downscale_delay_s, look_back_period_s, metrics_interval_s: Ray Serve's "Autoscaling config parameters").
### BEGIN SOLUTION
autoscaling = {
    "target_ongoing_requests": TARGET,
    "min_replicas": 1,
    "max_replicas": 2,
    "upscale_delay_s": 2,
    "downscale_delay_s": 5,
    "look_back_period_s": 4,
    "metrics_interval_s": 1,
}
### END SOLUTION
step_config = serve.shipped_config()
food11 = serve.deployment_options(step_config)
food11["max_ongoing_requests"] = MAX_ONGOING
food11["autoscaling_config"] = autoscaling
serve.apply(step_config)

STEPS = [(1, 2 / 3), (BETWEEN, 1), (12, 1), (1, 2)]  # (clients, length in steps of the profile's step_s)
below_cap = serve.step_load(lab.measurer.closed_loop, STEPS, "ray_serve", autoscaling)

# %% [markdown]
# Each step from both sides, as a table, then over time (dashed: what the replicas hold; dotted:
# where Serve adds one).

# %%
serve.show_step_load(below_cap, MAX_ONGOING)

# %% [markdown]
# The checks read Serve's samples. The share of time outside the replica is 1 - (time in replica) /
# (client latency); with full replicas and the rest queued, about 1 - replicas x cap / clients.

# %%
lab.record(concurrency_target.scales_on_the_target(below_cap), predicted=predicted_scales_on_target)
lab.record(concurrency_target.queue_in_front(below_cap, MAX_ONGOING), predicted=predicted_queue_in_front);

# %% [markdown]
# ## Baseten's rule: the target equal to the cap
#
# The target raised to the cap (4); steps of 1, 3, then 12 clients.
#
# **Expectation**: with 3 clients the replica holds 3 of 4, nothing queues, no replica is added. With
# 12 it is full, requests queue, and only then does Serve add one. The trade-off: replicas started
# early but not full (target below the cap), or full while requests wait for a new one (at the cap).

# %%
predicted_scaling_rules = None  # before you run: True if, with the target at the cap, Serve adds a replica
# only once the replica is full (12 clients, not 3), else False
at_cap_autoscaling = {**autoscaling, "target_ongoing_requests": MAX_ONGOING}
at_cap_config = serve.shipped_config()
food11 = serve.deployment_options(at_cap_config)
food11["max_ongoing_requests"] = MAX_ONGOING
food11["autoscaling_config"] = at_cap_autoscaling
serve.apply(at_cap_config)

AT_CAP_STEPS = [(1, 1 / 3), (BETWEEN, 1), (12, 1)]
at_cap = serve.step_load(lab.measurer.closed_loop, AT_CAP_STEPS, "ray_serve, target = cap", at_cap_autoscaling)
serve.show_step_load(at_cap, MAX_ONGOING)

# %% [markdown]
# The check compares both step loads: when Serve added the second replica (one *starting* counts),
# and until then the most requests inside the replicas and the mean queued.

# %%
lab.record(concurrency_target.scaling_rules(below_cap, at_cap, MAX_ONGOING), predicted=predicted_scaling_rules);

# %% [markdown]
# ## The cap must leave room for the predict slots
#
# One replica with two predict slots, 4 clients, caps of 1, 2, then 4. The replica's `/metrics` give
# its busy slots and its wait for a slot.
#
# **Expectation**:
#
# 1. Cap 1: at most one slot works, while requests queue in front (at least one on average).
# 2. Each higher cap keeps more slots busy; with 4, more than one on average.
# 3. From 1 to 4, the wait moves from the queue into the replica, and the throughput grows.
#
# Why past 2: a request holds its place until its answer is back, but is at the model only part of
# that time.

# %%
predicted_slots_need_room = None  # before you run: True if all three predictions hold here, else False
SLOT_CLIENTS, PREDICT_SLOTS = 4, 2
slot_runs, slot_samples = {}, {}
for cap in (1, PREDICT_SLOTS, MAX_ONGOING):
    config = serve.shipped_config()
    food11 = serve.deployment_options(config)
    food11.pop("autoscaling_config")
    food11.update(num_replicas=1, max_ongoing_requests=cap)
    env = food11["ray_actor_options"]["runtime_env"]["env_vars"]
    env["PREDICT_CONCURRENCY"] = str(PREDICT_SLOTS)
    if not serve.hardware.gpus:  # threads are a resource: the slots share the replica's cores
        env["INFERENCE_THREADS"] = str(max(1, serve.hardware.cores // PREDICT_SLOTS))
    serve.apply(config, quiet=cap != 1)
    label = f"ray_serve, {PREDICT_SLOTS} predict slots, max_ongoing_requests {cap}"
    with serve.watch() as watcher:
        slot_runs[cap] = lab.measurer.closed_loop(serve.url, SLOT_CLIENTS, name=label, service_stats=True)
    slot_samples[cap] = watcher.samples

print(concurrency_target.slot_table(slot_runs, slot_samples))
lab.record(concurrency_target.slots_need_room(slot_runs, slot_samples, PREDICT_SLOTS),
           predicted=predicted_slots_need_room);

# %% [markdown]
# ## A small queue: overload refused fast
#
# One replica, a cap of 2 and a queue of 2, 16 clients: the rest get 503 at once. Then no bound
# (`max_queued_requests: -1`, the default). A refused client waits 100 ms before retrying (a
# **backoff**); with `backoff_s=0`, refusals flood the server.
#
# **Expectation**: with the small queue, requests are refused (503 only), a refusal takes under a
# quarter of the answers' median time, and the answered p95 is under half that with no bound, where
# nobody is refused.

# %%
predicted_serve_p95_share = None  # before you run: the answered p95 with the small queue over the unbounded one's (x)

# %%
QUEUE_CLIENTS, BACKOFF_S = 16, 0.1
runs_by_queue = {}
for queued in (2, -1):
    config = serve.shipped_config()
    food11 = serve.deployment_options(config)
    food11.pop("autoscaling_config")
    food11.update(num_replicas=1, max_ongoing_requests=2, max_queued_requests=queued)
    serve.apply(config, quiet=queued != 2)
    label = f"ray_serve, 1 replica, target 2, queue {'of 2' if queued == 2 else 'unbounded'}"
    runs_by_queue[queued] = lab.measurer.closed_loop(serve.url, QUEUE_CLIENTS, name=label, backoff_s=BACKOFF_S)

lab.record(concurrency_target.bounded_queue_refuses("Ray Serve", runs_by_queue[2], runs_by_queue[-1], 2, "http_503"),
           predicted=predicted_serve_p95_share);

# %% [markdown]
# ## Do more replicas add capacity here?
#
# 8 clients against 1 and 2 replicas on the GPU node (a GPU each), 1, 2 and 3 on a CPU-only machine
# (a share of the cores each). The CPU samples count every process: they show when the cores are
# **full**.
#
# **Expectation**: GPU node: the second replica gives at least 1.3x the throughput. CPU only: two
# replicas fill the cores (CPU at least 95%), and a third adds at most 100% / (CPU % with two), +15%.
# (One GPU shared by two replicas: NOT CHECKED.)

# %%
predicted_replica_gain = None  # before you run: the requests/s of the last replica count over the one before
# (GPU node: 2 replicas over 1; CPU only: 3 over 2), a number (x)

# %%
replica_counts = (1, 2) if serve.hardware.gpus else (1, 2, 3)
by_replicas, cpu_by_replicas = {}, {}
for replicas in replica_counts:
    config = serve.shipped_config()
    food11 = serve.deployment_options(config)
    food11.pop("autoscaling_config")
    food11.update(num_replicas=replicas, max_ongoing_requests=MAX_ONGOING)
    if not serve.hardware.gpus:  # every run gives a replica the same share, small enough for the most replicas
        food11["ray_actor_options"]["num_cpus"] = int(serve.hardware.cores / max(replica_counts) * 1000) / 1000
    serve.apply(config, quiet=replicas > 1)
    with serve.watch() as watcher:
        label = f"ray_serve, {replicas} replica(s), 8 clients"
        by_replicas[replicas] = lab.measurer.closed_loop(serve.url, 8, name=label)
    cpu_by_replicas[replicas] = statistics.fmean(sample.cpu_percent for sample in watcher.samples)

for replicas, run in by_replicas.items():
    print(
        f"{replicas} replica(s): {run.throughput_rps:.1f} req/s, CPU {cpu_by_replicas[replicas]:.0f}% busy"
        f" ({run.throughput_rps / by_replicas[1].throughput_rps:.2f}x one replica's throughput)"
    )
lab.record(concurrency_target.replicas_add_capacity(by_replicas, cpu_by_replicas, serve.hardware.gpus,
                                                    serve.hardware.cores),
           predicted=predicted_replica_gain);

# %% [markdown]
# ## Past one machine: a two-node Ray cluster
#
# Serve places replicas on every **node** (machine) of a Ray cluster. The next cell starts two nodes
# here, deploys two replicas, at most one per node, and sends requests through the head node's proxy.
# On real machines, the README says how.
#
# **Expectation**: one replica per node, both nodes serve, all on 127.0.0.1. It must hold anywhere
# (`must_hold=True`): if not, the verdicts stop with an error, a fault of the lab.

# %%
TWO_NODE_REQUESTS = 40
report = concurrency_target.two_node_cluster(TWO_NODE_REQUESTS)
print(json.dumps(report, indent=1))
lab.record(concurrency_target.spread_over_nodes(report, TWO_NODE_REQUESTS));

# %% [markdown]
# ## The same two limits in FastAPI and Triton
#
# **FastAPI**: one predict slot, nothing in front: requests wait inside the process, none is refused.
#
# **Expectation**: from 4 to 16 clients nobody is refused, the median latency grows at least 2.5x, and
# the slot wait grows more than the inference, by at least one inference time.

# %%
predicted_fastapi_p50_growth = None  # before you run: FastAPI's median latency with 16 clients over 4 (x)

# %%
with lab.measurer.fastapi_variant("onnx", slots=1) as url:
    fastapi_runs = {c: lab.concurrent("onnx", c, url=url, name="fastapi_onnx, 1 slot") for c in (4, 16)}
lab.record(concurrency_target.fastapi_queues_inside(fastapi_runs[4], fastapi_runs[16], slots=1),
           predicted=predicted_fastapi_p50_growth);

# %% [markdown]
# **Triton** bounds its queue, without autoscaling: with dynamic batching on,
# `default_queue_policy { max_queue_size: N }` refuses a request that finds the queue full. Two
# instances taking one request at a time (`max_batch_size: 1`: like two one-slot replicas), 16 clients
# with the same backoff, a queue of 2 against no bound.
#
# **Expectation**: as for Ray Serve: refusals in under a quarter of the answered median time, and an
# answered p95 under half that with no bound, where none is refused.

# %%
predicted_triton_p95_share = None  # before you run: the answered p95 with Triton's queue of 2 over unbounded (x)

# %%
MODEL = "food_classifier_onnx"
triton_runs = {}
for max_queue in (2, 0):
    policy = f"default_queue_policy {{ max_queue_size: {max_queue} }}" if max_queue else ""
    edited = lab.triton.configs.config(MODEL).with_text(
        "max_batch_size: 1  instance_group [ { count: 1, kind: KIND_GPU, gpus: [ 0 ] }, "
        "{ count: 1, kind: KIND_GPU, gpus: [ 1 ] } ]  "
        f"dynamic_batching {{ {policy} }}"
    )
    served = lab.triton.configs.apply_config(MODEL, edited)  # the instances Triton now runs
    label = f"triton/{MODEL}, {served} instances, queue {'of ' + str(max_queue) if max_queue else 'unbounded'}"
    triton_runs[max_queue] = lab.measurer.closed_loop(
        lab.triton_http, 16, name=label, kind="triton-http", model=MODEL, backoff_s=BACKOFF_S, triton_stats=True
    )
    stats = triton_runs[max_queue].triton_stats
    print(
        f"  server: {stats['success_count']} answered, on average {stats['avg_queue_us'] / 1000:.1f} ms in the"
        f" queue and {stats['avg_compute_infer_us'] / 1000:.1f} ms computing"
    )
lab.triton.configs.restore_config(MODEL)
lab.record(concurrency_target.bounded_queue_refuses("Triton", triton_runs[2], triton_runs[0], 2),
           predicted=predicted_triton_p95_share);

# %% [markdown]
# Three engines, two limits: on work running (cap and slots, FastAPI's slot, Triton's instances) and
# on work waiting (queue bounds; FastAPI has none). Only Serve adds replicas.
#
# ## All the runs, and the verdicts

# %%
lab.table()
lab.verdicts()
# %% [markdown]
# ## Questions
#
# 1. With the target below the cap, then at it, what made Serve add the second replica, and what
#    did each choice cost the requests?
# 2. Why does a cap below the predict slots leave slots idle?
# 3. What does a bounded queue buy the answered requests, and what do the refused ones pay?
#
# **Hand in:** the step-load tables and plots, the slots table, the replica throughputs and the
# verdicts, with your predictions beside them.

# %% [markdown]
# Last, stop what this notebook started (a shared Serve goes back as shipped).

# %%
lab.stop()
