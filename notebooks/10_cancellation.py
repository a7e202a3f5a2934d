# %% [markdown]
# # 10. Cancellation: stop working for clients who left
#
# A client that gives up (a closed tab, an app's timeout, a retry) leaves its request on the
# server. A server that computes it anyway spends a predict slot on an answer nobody reads, while
# the clients still waiting queue behind it. **Cancellation** gives that capacity back: a request
# whose client has gone is dropped where it waits, or stopped at its next stopping point. A model
# call already running runs to its end.
#
# How each engine hears that a client left:
#
# - **FastAPI**: the handler also waits for `http.disconnect`, the ASGI message (ASGI: how a Python
#   server talks to its app) a server receives when the client closes the connection; a job still in
#   the slots' queue then leaves it, and a slot looks before decoding and before inference (`in_a_slot`
#   in `fastapi_onnx/app.py`). `ABANDON_ON_DISCONNECT=off` turns it off.
# - **Triton over gRPC**: the client cancels the call. Triton fails a cancelled request not yet
#   at the model; the lab's models check `request.is_cancelled()` once, before inference, and
#   answer CANCELLED. Either way nothing is computed. Triton 2.51, the lab's release, can crash
#   here: the optional notebook `appendix_triton_crash` measures why.
# - **Triton over HTTP**: nothing. A closed connection does not cancel a request: it is computed
#   and the answer thrown away.
# - **Ray Serve**: its proxy sees the connection close. A request not yet in a replica is dropped;
#   in a replica, its handler is cancelled at its next `await`.

# %%
from servelab.lab import Lab
from servelab.lessons import cancellation

lab = Lab.connect("10_cancellation")
serve = lab.ray_serve()
TRITON_MODEL, REFINE_MODEL = "food_classifier_onnx", "food_refine"
experiment = cancellation.Experiment(
    lab, patient=4, impatient=4, stream_patient=2, stream_impatient=2, steps=8, leave_after=2, refine_model=REFINE_MODEL
)

# %% [markdown]
# ## The experiment
#
# **Patient** clients wait however long it takes. **Impatient** clients give up after a deadline,
# cancel the way their protocol does (HTTP: close the connection; gRPC: cancel the call), and a new
# one arrives a little later. Every engine runs one request at a time, so a queue forms.
#
# The deadline is each engine's latency for a request alone, `s`, measured first: with patient
# requests queued ahead, an impatient client gives up while its request still waits, never as its
# answer is being made (the appendix shows why that matters for Triton). The impatient clients
# together offer about half of what the engine serves.
#
# The server's own account, read before and after each run (the services' `/metrics`, Triton's
# statistics), says what it computed. An inference is **wasted** when its answer reached nobody:
# inferences run less answers received. **Goodput** is the answers per second that reached a
# client still waiting: a run's `throughput_rps`, since a cancelled request is never answered.
#
# **Expectations** (predict whether each holds)
#
# 1. Abandoning off (FastAPI, `ABANDON_ON_DISCONNECT=off`): wasted inferences are at least half the
#    cancelled requests; the patient clients' p95 is higher and the goodput lower than with it on.
# 2. Abandoning on: the waste is under a quarter of that with it off, and the server abandons at
#    least half the cancelled requests before the model.
# 3. Triton over HTTP wastes at least half the cancelled requests; over gRPC at least half are
#    never computed, and the waste is under a quarter of them.
# 4. Ray Serve's waste is under a quarter of the cancelled requests.
#
# ## FastAPI, with and without abandoning

# %%
predicted_waste_off = None  # before you run: abandoning off, the wasted inferences as a share of the cancelled (%)
predicted_waste_on_share = None  # and the waste with abandoning on, as a share of the waste with it off (%)

# %%
# Your turn: SETTINGS = (..., ...), the two values of the service's setting ABANDON_ON_DISCONNECT,
#   off first (docs/settings.md, ABANDON_ON_DISCONNECT).
### BEGIN SOLUTION
SETTINGS = ("off", "on")
### END SOLUTION
for setting in SETTINGS:
    with lab.measurer.fastapi_variant("onnx", slots=1, ABANDON_ON_DISCONNECT=setting) as url:
        experiment.requests(f"fastapi_onnx, 1 slot, abandon {setting}", url)

# %% [markdown]
# ## Triton, over HTTP and over gRPC
#
# One instance, one request per execution, dynamic batching on, so that requests wait in the
# scheduler's queue where a cancel can drop them. Triton counts a request its model answered
# CANCELLED as a success, so the inferences computed are its successes less those (read from the
# model's lines in Triton's log).

# %%
predicted_triton_grpc = None  # before you run: over gRPC, the wasted inferences as a share of the cancelled (%)

# %%
one_at_a_time = (
    lab.triton.configs.config(TRITON_MODEL)
    .with_fields(max_batch_size=1)
    .with_instance_groups([{"count": 1, "kind": "KIND_GPU", "gpus": [0]}])  # a CPU one without a GPU
    .with_dynamic_batching()
)
with experiment.triton_config(TRITON_MODEL, one_at_a_time):
    for protocol in ("http", "grpc"):
        experiment.triton_requests(protocol, TRITON_MODEL)

# %% [markdown]
# ## Ray Serve
#
# One replica, no autoscaling, the shipped `max_ongoing_requests`, one predict slot inside:
# requests wait in the replica for the slot and, beyond that target, in front of it. The
# deployment stays for the streams below.

# %%
predicted_ray_drops = None  # before you run: Ray Serve's wasted inferences as a share of the cancelled (%)

# %%
config = serve.shipped_config()
food11 = serve.deployment_options(config)
food11.pop("autoscaling_config")
food11.update(num_replicas=1)
serve.apply(config)
experiment.requests("ray_serve, 1 replica", serve.url)

# %% [markdown]
# ## Streams: stopping a generation midway
#
# Work that streams its answer a step at a time (a text generation, say) can also stop midway:
# between two steps the server looks whether anyone still reads. The step running then finishes;
# the steps after it are saved.
#
# The workload is a **refinement** (`food11.py`): step k runs MobileNetV2 on one
# more view of the photo and streams the running mean of the probabilities, an answer that settles
# as the steps go. Served three ways:
#
# - **FastAPI**, `POST /refine`: NDJSON (newline-delimited JSON: one JSON object per line), a line
#   per step. A stream takes one slot for all its steps, as Triton's instance does below; before
#   each step the slot looks whether its client has gone (`refinement`). `ABANDON_ON_DISCONNECT=off`
#   computes every step anyway.
# - **Triton**, `food_refine`: a *decoupled* Python-backend model (one request, many responses),
#   read over gRPC streaming; its one instance streams one request at a time. After each step it
#   asks `response_sender.is_cancelled()`. The config parameter `abandon_on_cancel: "off"` computes
#   every step anyway.
# - **Ray Serve**: the same `/refine`, fastapi_onnx's app in a replica. The proxy cancels the
#   response at its next `await`, which tells the slot's thread; with `ABANDON_ON_DISCONNECT=off`
#   the steps go on in the slot anyway.
#
# LLM engines (vLLM, TensorRT-LLM) do the same inside their loop: their *abort* drops a request
# between two iterations.
#
# The load: `stream_patient` clients read all `steps` steps; `stream_impatient` clients read
# `leave_after` steps, leave, and start again. One step at a time on each engine. A step **for a
# client who left** is one that ended after the server knew the client was gone, by the server's
# own counters.
#
# **Expectations for streams**, on each engine:
#
# 1. Cancellation off: the steps computed for clients who left are at least half of the steps they
#    left behind (streams left x (`steps` - `leave_after`)).
# 2. On: at most 2 steps per client who left (the running step, and one more while the news
#    travels).
# 3. The patient clients get their last step sooner with it on (median).

# %%
predicted_fastapi_stream_stops = None  # before you run: FastAPI's steps computed per client who left, cancellation off

# %%
for setting in SETTINGS:
    with lab.measurer.fastapi_variant("onnx", slots=1, ABANDON_ON_DISCONNECT=setting) as url:
        experiment.stream("FastAPI", setting, url)

# %% [markdown]
# Triton's `food_refine`, `abandon_on_cancel` off, then as shipped (on). Here a client cancels
# between two steps, while the model computes the next, where the 2.51 crash (see the appendix)
# is rare. Should it crash anyway, the run is marked NOT A CLEAN RUN (the local stack, or Docker,
# restarts Triton) and its verdict is NOT CHECKED.

# %%
predicted_triton_stream_stops = None  # before you run: Triton's steps computed per client who left, cancellation off

# %%
refine_off = lab.triton.configs.config(REFINE_MODEL).with_parameters(abandon_on_cancel="off")
with experiment.triton_config(REFINE_MODEL, refine_off):
    experiment.stream("Triton", "off")
experiment.stream("Triton", "on")

# %% [markdown]
# Ray Serve's replica as deployed above (on), then with `ABANDON_ON_DISCONNECT=off`.

# %%
predicted_ray_stream_stops = None  # before you run: Ray Serve's steps per client who left, cancellation off

# %%
experiment.stream("Ray Serve", "on", serve.url)
food11["ray_actor_options"]["runtime_env"]["env_vars"]["ABANDON_ON_DISCONNECT"] = "off"
serve.apply(config)
experiment.stream("Ray Serve", "off", serve.url)
serve.restore()

# %%
experiment.show_streams()
stream_predictions = {
    "FastAPI": predicted_fastapi_stream_stops,
    "Triton": predicted_triton_stream_stops,
    "Ray Serve": predicted_ray_stream_stops,
}
streams = experiment.streams
for engine, predicted in stream_predictions.items():
    lab.record(cancellation.stream_stops_at_the_next_step(engine, streams[engine, "off"], streams[engine, "on"]),
               predicted=predicted)

# %% [markdown]
# Stopping midway takes three things on every engine: work cut into steps, the server learning
# that the client left, and a check between two steps. The running step is never saved: the finer
# the steps, the less a client who left costs.
#
# ## Goodput and waste, side by side

# %%
experiment.show_goodput_and_waste()

# %% [markdown]
# ## The expectations, checked
#
# A condition about clients who left reads NOT CHECKED in a run where nobody left.

# %%
runs, wasted = experiment.runs, experiment.wasted
off, on = "fastapi_onnx, 1 slot, abandon off", "fastapi_onnx, 1 slot, abandon on"
http, grpc = f"triton/{TRITON_MODEL}, http", f"triton/{TRITON_MODEL}, grpc"
ray = "ray_serve, 1 replica"
lab.record(cancellation.waste_without_cancellation(runs[off], runs[on], wasted[off]),
           predicted=predicted_waste_off)
lab.record(cancellation.abandoning_cuts_the_waste(runs[off], runs[on], wasted[off], wasted[on]),
           predicted=predicted_waste_on_share)
lab.record(cancellation.triton_cancels_over_grpc(runs[http], runs[grpc], wasted[http], wasted[grpc]),
           predicted=predicted_triton_grpc)
lab.record(cancellation.ray_drops_gone_requests(runs[ray], wasted[ray]), predicted=predicted_ray_drops);

# %% [markdown]
# Cancellation is cheap where the server can drop work not yet started, which is most of it when
# a queue forms. Its one cost: the server has to notice. An HTTP server must watch the connection;
# a protocol with a cancel message (gRPC) tells it.
#
# ## All the runs, and the verdicts

# %%
lab.table()
lab.verdicts()

# %% [markdown]
# ## Questions
#
# 1. How did abandoning change the patient clients' p95 and the goodput, and why?
# 2. What did Triton compute for clients who left over HTTP, and over gRPC? Why do the protocols differ?
# 3. Why does a stream stopped midway still cost a step or so, and what would finer steps change?
#
# **Hand in:** the streams table and plot, the goodput and waste plot, the results table and the
# verdicts, with your predictions beside them.
