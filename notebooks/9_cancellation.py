# %% [markdown]
# # 9. Cancellation: stop working for clients who left
#
# A client that gives up (a closed browser tab, an app's timeout, a retry that replaced the
# request) leaves its request behind on the server. A server that computes it anyway spends a
# predict slot on an answer nobody reads, and the clients still waiting queue behind that work.
# **Cancellation** gives the capacity back: a request whose client has gone is dropped where it
# waits and stopped at the next point where it can stop. Only work not yet started can be saved:
# a model call already running in a thread runs to its end.
#
# How each engine of the lab hears that a client left, and what it saves:
#
# - **FastAPI** (this lab's services): a task waits for the connection's `http.disconnect`
#   message, and the handler looks at each stage boundary: before preprocessing, while waiting
#   for a predict slot, before inference. `ABANDON_ON_DISCONNECT=off` turns it off.
# - **Triton over gRPC**: the client cancels the call. Triton fails a cancelled request that has
#   not reached the model yet; a request already handed to the model is answered CANCELLED when
#   `request.is_cancelled()` says so before inference (the lab's models check once, after
#   decoding, and log it). Either way it is not computed.
# - **Triton over HTTP**: nothing. In the release the lab pins, a closed connection does not
#   cancel a request: it is computed, and the answer thrown away.
# - **Ray Serve**: its proxy sees the connection close. A request not yet in a replica is
#   dropped; in a replica, its handler is cancelled at its next `await`.
#
# uvicorn, which runs the FastAPI apps, never cancels a handler by itself: the service has to
# notice (`predict_api.py` and `client_gone.py` show how).

# %%
import math

import matplotlib.pyplot as plt

from servelab import service_stats, triton_stats
from servelab.expectations import condition, figure, measured
from servelab.lab import Lab

lab = Lab.connect()
serve = lab.ray_serve()
print(f"The models run on {lab.hardware()}.")

# %% [markdown]
# ## The experiment
#
# **Patient** clients wait for their answer however long it takes. **Impatient** clients give up
# after a deadline and cancel the way their protocol does: over HTTP they close the connection,
# over gRPC they cancel the call. A new impatient client then arrives a little later. Every
# engine here runs one request at a time (one predict slot, one Triton instance taking one request
# per execution, one Ray Serve replica with one slot), so a queue forms in front of the model.
#
# The deadline and the pace come from each engine's own latency for a request alone, `s`,
# measured first: an impatient client waits `2 s`, well below the queueing delay that 8 clients
# cause, and the impatient clients together offer about half of what the engine can serve, so that
# an engine that computes everything still keeps up.
#
# What the server did comes from its own account, read before and after each run: the FastAPI
# services' and Ray Serve's `/metrics`, Triton's statistics and metrics. An inference is
# **wasted** when its answer reached nobody: the inferences the server ran during the run, less
# the answers the clients received. **Goodput** is the answers per second that reached a client
# still waiting.

# %%
PATIENT, IMPATIENT = 4, 4
DURATION_S = max(lab.profile.duration_s, 8)
ALONE_S = 3  # seconds of one client at a time, to measure a request alone
TRITON_MODEL = "food_classifier_onnx"


def pacing(alone_ms: float) -> tuple[float, float]:
    """(patience, back-off) in seconds for an engine whose request alone takes `alone_ms` (s): an
    impatient client gives up after 2 s, and the next arrives after the back-off, so each sender
    sends one request per 2 s x IMPATIENT; together, one per 2 s, half of what one slot serves."""
    patience_s = 2 * alone_ms / 1000
    return patience_s, 2 * IMPATIENT * alone_ms / 1000 - patience_s


def paced(name: str, address: str, kind: str = "fastapi", model: str | None = None) -> tuple[float, float]:
    """(patience, back-off) for the engine at `address`, from its latency for a request alone."""
    alone = lab.closed_loop(address, 1, ALONE_S, target=f"{name}, 1 client", kind=kind, model=model)
    patience_s, backoff_s = pacing(alone.latency.p50_ms)
    print(f"{name}: a request alone {alone.latency.p50_ms:.1f} ms; patience {1000 * patience_s:.0f} ms")
    return patience_s, backoff_s


def impatient_load(name: str, address: str, pace: tuple[float, float], kind: str = "fastapi", model=None):
    """PATIENT patient and IMPATIENT impatient clients for DURATION_S, at `pace` (patience, back-off)."""
    return lab.closed_loop(
        address, PATIENT + IMPATIENT, DURATION_S, target=name, kind=kind, model=model,
        impatient=IMPATIENT, patience_s=pace[0], backoff_s=pace[1],
    )  # fmt: skip


runs, wasted = {}, {}


def account(name: str, result, inferences: float) -> None:
    """Keep the run and its waste: inferences the server ran, less answers the clients got (NaN
    where the server's count cannot be read)."""
    runs[name] = result
    answered = len(result.latencies_ms)
    wasted[name] = max(inferences - answered, 0) if not math.isnan(inferences) else math.nan
    print(
        f"  {result.cancelled} cancelled by their clients, {answered} answered; the server ran {inferences:.0f}"
        f" inferences: {wasted[name]:.0f} for nobody. Patient clients' p95: {result.patient_latency.p95_ms:.0f} ms"
    )


# %% [markdown]
# **Predictions**
#
# 1. Without cancellation (FastAPI with `ABANDON_ON_DISCONNECT=off`), the server computes answers
#    nobody reads, and the patient clients pay for it: wasted inferences are at least half the
#    cancelled requests; the patient clients' p95 is higher and the goodput lower than with it on.
# 2. With it on, the waste falls to about the inferences already running when their client left:
#    under a quarter of the waste with it off, and the server abandons at least half the
#    cancelled requests before they reach the model.
# 3. Triton over HTTP computes every request whose client left (waste at least half the cancelled
#    requests); over gRPC the cancels reach it: at least half the cancelled requests are never
#    computed (Triton fails them before the model, or the model answers them CANCELLED), and the
#    waste is under a quarter of the cancelled requests.
# 4. Ray Serve drops them too: its waste is under a quarter of the cancelled requests.
#
# ## FastAPI, with and without abandoning

# %%
for setting in ("off", "on"):
    name = f"fastapi_onnx, 1 slot, abandon {setting}"
    with lab.fastapi_variant("onnx", slots=1, ABANDON_ON_DISCONNECT=setting) as url:
        pace = paced(name, url)
        with service_stats.measure(url) as stats:
            result = impatient_load(name, url, pace)
    result.service_stats = stats.delta.to_dict()
    account(name, result, stats.delta.inferences)
    print(f"  abandoned by the server, by stage: {stats.delta.abandoned_by_stage or 'none'}")

# %% [markdown]
# ## Triton, over HTTP and over gRPC
#
# The ONNX model with one instance taking one request per execution, and dynamic batching on, so
# that requests wait in the scheduler's queue where a cancel can drop them. Triton's statistics
# count a request the model answered CANCELLED as a success, so the inferences computed are its
# successes less the cancelled requests the model logged (read from Triton's log: locally the
# stack's log file; on the node the copy the Triton container writes to a volume this notebook's
# container mounts, while `docker logs triton_server` shows the same lines).

# %%
edited = lab.config(TRITON_MODEL).with_fields(max_batch_size=1)
lab.apply_config(TRITON_MODEL, edited.with_instance_groups([{"count": 1, "kind": "KIND_CPU"}]).with_dynamic_batching())



def cancelled_by_model() -> float:
    """Requests the model has answered CANCELLED so far, from its log (NaN where this notebook
    finds no log to read: a Triton container started without the lab's compose file)."""
    log = lab.triton_log()
    return math.nan if log is None else triton_stats.cancelled_by_model(log.read_text(), TRITON_MODEL)


for kind, address in (("triton-http", lab.triton_http), ("triton-grpc", lab.triton_grpc)):
    name = f"triton/{TRITON_MODEL}, {kind.removeprefix('triton-')}"
    pace = paced(name, address, kind=kind, model=TRITON_MODEL)
    logged_before = cancelled_by_model()
    with triton_stats.measure(lab.triton_http, TRITON_MODEL) as stats:
        result = impatient_load(name, address, pace, kind=kind, model=TRITON_MODEL)
    result.triton_stats = stats.delta.to_dict()
    result.triton_stats["cancelled_by_model"] = cancelled_by_model() - logged_before
    # Triton counts a request the model answered CANCELLED as a success: it was not computed.
    account(name, result, stats.delta.success_count - result.triton_stats["cancelled_by_model"])
    print(
        f"  Triton failed {stats.delta.fail_count} cancelled requests before the model; the model answered"
        f" {result.triton_stats['cancelled_by_model']:.0f} CANCELLED instead of computing them"
    )
lab.restore_config(TRITON_MODEL)

# %% [markdown]
# ## Ray Serve
#
# One replica, no autoscaling, with the shipped concurrency target (`max_ongoing_requests`) and
# one predict slot inside: requests wait in the replica for its slot and, beyond the target, in
# front of it.

# %%
config = serve.shipped_config()
food11 = serve.settings(config)
food11.pop("autoscaling_config")
food11.update(num_replicas=1)
serve.apply(config)
name = "ray_serve, 1 replica"
pace = paced(name, serve.url)
with service_stats.measure(serve.url) as stats:  # with one replica, its /metrics are the deployment's
    result = impatient_load(name, serve.url, pace)
result.service_stats = stats.delta.to_dict()
account(name, result, stats.delta.inferences)
serve.restore()

# %% [markdown]
# ## Goodput and waste, side by side

# %%
names = list(runs)
fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4), sharey=True)
left.barh(names, [runs[n].goodput_rps for n in names], color="tab:green")
left.set_xlabel("goodput (answers to clients still waiting, req/s)")
right.barh(names, [wasted[n] / runs[n].wall_s for n in names], color="tab:red")
right.set_xlabel("wasted inferences per second (computed for nobody)")
left.invert_yaxis()
fig.suptitle(f"{PATIENT} patient + {IMPATIENT} impatient clients, {lab.hardware()}")
fig.tight_layout()
plt.show()

# %% [markdown]
# ## The predictions, checked

# %%
def computed_for_nobody(name: str, case: str):
    """The condition that the run `name` wasted at least half as many inferences as were cancelled."""
    return condition(
        f"{case}, wasted inferences are at least half the cancelled requests",
        wasted[name] >= runs[name].cancelled / 2,
        measured(f"wasted inferences, {case}", wasted[name]),
        figure(runs[name], "cancelled", f"cancelled, {case}"),
    )


off_name, on_name = "fastapi_onnx, 1 slot, abandon off", "fastapi_onnx, 1 slot, abandon on"
off, on = runs[off_name], runs[on_name]
lab.expect(
    "without cancellation, the server computes answers nobody reads, and the patient clients pay",
    computed_for_nobody(off_name, "with abandoning off"),
    condition(
        "the patient clients' p95 is higher with it off than on",
        off.patient_latency.p95_ms > on.patient_latency.p95_ms,
        figure(off, "patient_latency.p95_ms", "patient p95, off"),
        figure(on, "patient_latency.p95_ms", "patient p95, on"),
    ),
    condition(
        "the goodput is lower with it off than on",
        off.throughput_rps < on.throughput_rps,
        figure(off, "throughput_rps", "goodput, off"),
        figure(on, "throughput_rps", "goodput, on"),
    ),
);
abandoned = sum(on.service_stats["abandoned_by_stage"].values())
lab.expect(
    "with abandoning on, the waste falls to the inferences already running when their client left",
    condition(
        "the waste is under a quarter of the waste with it off",
        wasted[on_name] < wasted[off_name] / 4,
        measured("wasted inferences, with abandoning on", wasted[on_name]),
        measured("wasted inferences, with abandoning off", wasted[off_name]),
    ),
    condition(
        "the server abandons at least half the cancelled requests before the model",
        abandoned >= on.cancelled / 2,
        measured("abandoned by the server", abandoned),
        figure(on, "cancelled", "cancelled, on"),
    ),
);
http_name, grpc_name = (f"triton/{TRITON_MODEL}, {protocol}" for protocol in ("http", "grpc"))
grpc = runs[grpc_name]
lab.expect(
    "Triton over HTTP computes for clients who left; over gRPC the cancels reach it",
    computed_for_nobody(http_name, "over HTTP"),
    condition(
        "over gRPC, at least half the cancelled requests are never computed",
        grpc.triton_stats["fail_count"] + grpc.triton_stats["cancelled_by_model"] >= grpc.cancelled / 2,
        figure(grpc, "triton_stats.fail_count", "failed before the model, gRPC"),
        figure(grpc, "triton_stats.cancelled_by_model", "answered CANCELLED by the model, gRPC"),
        figure(grpc, "cancelled", "cancelled, gRPC"),
    ),
    condition(
        "over gRPC, the waste is under a quarter of the cancelled requests",
        wasted[grpc_name] < grpc.cancelled / 4,
        measured("wasted inferences, gRPC", wasted[grpc_name]),
        figure(grpc, "cancelled", "cancelled, gRPC"),
    ),
);
ray = runs["ray_serve, 1 replica"]
lab.expect(
    "Ray Serve drops the requests of clients who left",
    condition(
        "its waste is under a quarter of the cancelled requests",
        wasted["ray_serve, 1 replica"] < ray.cancelled / 4,
        measured("wasted inferences, Ray Serve", wasted["ray_serve, 1 replica"]),
        figure(ray, "cancelled", "cancelled, Ray Serve"),
    ),
);

# %% [markdown]
# Cancellation is cheap where the server can drop work that has not started, which is most of
# the work when a queue forms: the clients who left stop taking the capacity that the clients
# still waiting need. It costs one thing: the server has to notice. An HTTP server must watch the
# connection; a protocol with a cancel message (gRPC) tells it.
#
# ## All the runs, and the verdicts

# %%
lab.table()
lab.verdicts()
