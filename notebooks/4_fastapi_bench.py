# %% [markdown]
# # 4. Benchmarking the FastAPI service
#
# **Time:** about 22 minutes (11 reading, 4 running, 7 hands-on; `python -m servelab.time_plan`)
#
# The FastAPI service from notebook 3 is up. In this notebook you:
#
# 1. send it a real request, the way its interactive documentation (`/docs`) would;
# 2. follow one photo through the whole system: browser form, GourmetGram, FastAPI, model, and back;
# 3. measure how fast it answers **one** user (PyTorch, then ONNX Runtime);
# 4. measure what happens when **sixteen** users send at once, and see where the extra time goes;
# 5. share the cores out: threads per inference, then processes.
#
# **Where the cells run.** In Docker (the GPU node, or any machine with Docker): in the Jupyter
# container of the Compose project from notebook 3 (open `work/notebooks/4_fastapi_bench.ipynb`
# there). On your laptop without Docker: right here. The notebook starts its own local services,
# and stops them at the end.
#
# Every number in this notebook is printed by a cell from a measurement made during your run.
# Expect different numbers on a GPU node and on a laptop: the *trends* are what the lab is about.

# %%
import base64
import json
import threading
import time

import matplotlib.pyplot as plt
import psutil
import requests

from servelab import paths
from servelab.lab import Lab
from servelab.lessons import fastapi_bench
from servelab.measure.resources import ResourceSampler, summarize
from servelab.report import plots

lab = Lab.connect("4_fastapi_bench", triton=False)  # these notebooks use FastAPI only

# %% [markdown]
# ## The API's own documentation: `/docs`
#
# FastAPI builds a documentation page from the request and response models in `predict_api.py`.
# Open it in your browser (the cell prints where), click **POST /predict**, then **Try it out**:
# you can send requests from the page.
#
# In Docker, your browser reaches the service on port 8100 of the Docker host (through your SSH
# tunnel on the node: notebook 3 says how). The name
# `fastapi_pt` only exists inside the Docker network, where this notebook runs.

# %%
for flavor, url in lab.fastapi_urls.items():
    if lab.on_compose:
        print(
            f"FastAPI ({flavor}): open http://127.0.0.1:{8100 if flavor == 'pt' else 8101}/docs in your browser "
            f"(the Compose project's published port; this notebook itself reaches it as {url})."
        )
    else:
        print(f"FastAPI ({flavor}): {url}/docs")

# %% [markdown]
# The page is drawn from a machine-readable description of the API, `/openapi.json`. Here is what
# it says about `/predict`: the request body it accepts, and each answer it can give.

# %%
fastapi_url = next(iter(lab.fastapi_urls.values()))
openapi = requests.get(f"{fastapi_url}/openapi.json", timeout=10).json()


def resolve(schema: dict) -> dict:
    """Follow a '$ref' into the document's components/schemas."""
    while "$ref" in schema:
        schema = openapi["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
    return schema


predict_operation = openapi["paths"]["/predict"]["post"]
request_schema = resolve(predict_operation["requestBody"]["content"]["application/json"]["schema"])
print("POST /predict, request body:")
print(json.dumps(request_schema, indent=2))
print("\nAnswers:")
for status_code, answer in predict_operation["responses"].items():
    body = answer.get("content", {}).get("application/json", {}).get("schema", {})
    fields = ", ".join(resolve(body).get("properties", {})) or "no body"
    print(f"  {status_code}: {answer['description']} (fields: {fields})")

# %% [markdown]
# ## One real request
#
# The body needs the image as a base64 string. Here is the sample photo GourmetGram ships with,
# encoded, and the shape of the JSON body (truncated: the full string is long). To try it in the
# Swagger page yourself, run `print(image_b64)` in a new cell, and paste the output in place of
# `"string"`.

# %%
image_bytes = lab.sample_image()
image_b64 = base64.b64encode(image_bytes).decode()
body = json.dumps({"image": image_b64})
print(
    f"{paths.SAMPLE_IMAGE.name}: {len(image_bytes)} bytes as a file, {len(image_b64)} characters in base64 "
    f"({len(image_b64) / len(image_bytes):.2f}x the file)"
)
print(f"JSON body, {len(body)} characters: {body[:60]}...{body[-12:]}")

# %% [markdown]
# `lab.predict` posts exactly that body to `/predict`, as the Swagger page would, and returns the
# JSON answer. (If `/health` said the weights are untrained, the label is arbitrary, but the request
# costs what a real one costs.)

# %%
api_answer = lab.predict("pt")
print(f"FastAPI (PyTorch) answered: {api_answer}")

# %% [markdown]
# ## The whole path: GourmetGram in front
#
# Now the way a user gets there: upload a photo in the web page. GourmetGram receives the
# upload, forwards it to FastAPI, and renders the answer as HTML. Open the page in your browser to
# click through it yourself. The next cell does the same as the browser: it posts the photo as a
# multipart form upload to GourmetGram's `/predict`, and reads the label out of the page it gets
# back. `lab.ui` starts a GourmetGram in front of the PyTorch service, where this notebook runs;
# in Docker, your browser has the Compose project's own, the `gourmetgram` service on port 8300.

# %%
ui_url = lab.ui("fastapi_pt")
print(f"GourmetGram: {ui_url}" + ("  (in your browser: http://127.0.0.1:8300/)" if lab.on_compose else ""))

ui_answer = lab.upload_to_ui(ui_url, paths.SAMPLE_IMAGE.name, image_bytes)
print(f"Same label as the direct API call: {ui_answer.label == api_answer['prediction']}")

# %% [markdown]
# GourmetGram's sample photos are named for what they show: `bread.jpg`, `fried_egg.jpg` and
# `soup.jpg` (Food-11's Bread, Egg and Soup). They are drawn cartoons (`gourmetgram/make_samples.py`),
# not photographs.
#
# **Expectation.** With trained weights, each sample gets the class its name says. Before you run the
# next cell: which would you bet on, and why might a model trained on photographs miss a cartoon?
# The verdict gives each photo's label and probability. With untrained weights (`/health` says
# which), the labels mean nothing, and the check says NOT CHECKED.

# %%
predicted_labels = None  # before you run this cell: True if every sample gets its name's class, else False
served_weights = requests.get(f"{lab.fastapi_url('pt')}/health", timeout=10).json()["weights"]
print(f"FastAPI (PyTorch) /health: {served_weights} weights")
sample_pages = {}
for photo in sorted(paths.SAMPLE_IMAGE.parent.glob("*.jpg")):
    page = lab.upload_to_ui(ui_url, photo.name, photo.read_bytes())
    sample_pages[photo.name] = (page.label, page.probability)
lab.record(fastapi_bench.samples_get_their_labels(sample_pages, served_weights), predicted=predicted_labels);

# %% [markdown]
# ## How fast for one user? Sequential latency
#
# Now measure. `lab.sequential` sends requests one at a time: each is sent as soon as the previous
# one has its answer, so no request ever waits behind another. What you measure is the time to
# serve one request: HTTP, JSON, base64 and JPEG decoding, preprocessing, the model, and the way
# back. With one request in flight, throughput is just the inverse of the mean latency.
#
# We look at the median (p50, the typical request) and at the tail (p95, p99: the slowest 5% and 1%),
# because users notice the slow requests.


# %%
def report(result) -> None:
    """The run in one line; a tail percentile that needs more requests than the run had is n/a."""
    tail = " | ".join(f"p{p} {result.latency_ms(p):.1f} ms".replace("nan ms", "n/a") for p in (95, 99))
    print(
        f"  median {result.latency.p50_ms:.1f} ms | {tail} | "
        f"throughput {result.throughput_rps:.1f} req/s over {result.requests} requests"
        + (f" | 1000 / mean latency = {1000 / result.latency.mean_ms:.1f} req/s" if result.concurrency == 1 else "")
    )


sequential_pt = lab.sequential("pt")
report(sequential_pt)

# %% [markdown]
# ## Switch to ONNX Runtime
#
# The same model, exported to ONNX and run by ONNX Runtime, usually takes less time per inference
# than PyTorch's eager mode: ONNX Runtime optimises the whole graph ahead of time (fusing layers,
# folding constants), while eager PyTorch runs one operator after the other as Python calls them.
# The service around the model is the same code (`predict_api.py`), so any difference comes from
# the runtime.
#
# Both services run side by side, in Docker as locally (`fastapi_onnx` beside `fastapi_pt`), so
# there is nothing to switch: ask the ONNX one what it runs.


# %%
def served_runtime(url: str) -> str | None:
    """The runtime a FastAPI service reports in /health; None while it is down or restarting."""
    try:
        return requests.get(f"{url}/health", timeout=5).json()["runtime"]
    except (requests.RequestException, ValueError, KeyError):
        return None


print(f"ONNX Runtime service: {lab.fastapi_url('onnx')} ({served_runtime(lab.fastapi_url('onnx'))})")

# %% [markdown]
# Same measurement, ONNX Runtime this time. Then the comparison, judged on the two runs you just
# measured: their medians (one request at a time, the throughput is one over the mean latency, so
# it is not judged again). Each service also times its own model calls (its
# `/metrics`, read before and after each run), so when the verdict fails it can say how much of a
# request the model call was.

# %%
predicted_onnx_faster = None  # before you run this cell: True if ONNX Runtime answers faster, else False
sequential_onnx = lab.sequential("onnx")
report(sequential_onnx)

# %%
lab.record(fastapi_bench.runtime_comparison(sequential_pt, sequential_onnx, lab.hardware()),
           predicted=predicted_onnx_faster);

# %% [markdown]
# ## Sixteen users at once
#
# The service answers one user quickly. Now start 16 *senders* at the same time, each sending its
# next request as soon as it gets an answer (a closed loop): there are always 16 requests in the
# system. The service has a few **inference slots** (`/health` says how many: by default one per
# core), so at most that many images are in the model at once, and the other requests wait in line.
#
# What should happen? With one sender, the service decodes a request, runs the model, answers, and
# then waits for the next: its cores are often idle. With 16, a request is always waiting, so the
# slots never idle, and the decoding of the next request overlaps the model's work on this one:
# throughput rises, but only up to what the cores can do. Beyond that, the extra requests wait.
#
# *Little's law* (requests in a system = throughput × the time each spends in it) says how much.
# Our 16 senders are a closed loop with no pause between requests, so there are always exactly 16
# requests in the system, and the law cannot fail there: the mean latency *is* 16 / throughput, a
# figure the cell prints as a reminder rather than checks. Applied to a part of the system it tells
# us something we did not put in: the inference slots hold, on average, throughput × (time of one
# inference) requests. If that is close to the number of slots, the slots were never idle.
#
# Each request's time that is not spent in a slot (or decoding, or on the network) is **queueing
# delay**: no faster model removes it, only more capacity or fewer requests in line. The service
# times the wait for a slot itself (`/metrics`: `predict_slot_wait_seconds`), so we can read it
# rather than guess it from the client's latency.
#
# **Expectation.** With 16 senders:
#
# 1. throughput rises above the one-at-a-time throughput;
# 2. the inference slots are busy at least 90% of the time: throughput × the service's mean
#    inference time is at least 0.9 × the number of slots;
# 3. most of each request's time is waiting: the service's mean wait for a slot is more than half
#    of the mean latency.
#
# Two extras run alongside the measurement:
#
# - **Resource sampling** records CPU (and GPU, where it can see one) use, in place of watching `nvtop`.
#   Locally the server process's own CPU use is drawn too: the load generator runs on the same
#   machine and uses CPU as well.
# - **Does the queue block everything?** A background thread asks `/health` for its answer ten times a
#   second. `/health` does no model work, and the event loop only *awaits* the inference slot, so
#   a health check should not wait behind the sixteen predictions. Computation queues; other I/O
#   does not.


# %%
predicted_queueing = None  # before you run: True if all three of the expectation hold here, else False
predicted_health_free = None  # and True if /health answers without waiting behind the predictions, else False


def listening_pids(url: str) -> list[int]:
    """Locally, the process serving `url`, so the sampler can show its own CPU use. In Docker the
    server is in another container, out of this one's sight: the sampler then shows the whole machine."""
    if lab.on_compose:
        return []
    port = int(url.rsplit(":", 1)[1])
    return sorted(
        {
            conn.pid
            for conn in psutil.net_connections("tcp")
            if conn.status == psutil.CONN_LISTEN and conn.laddr.port == port and conn.pid
        }
    )


def health_check_ms(url: str) -> float:
    started = time.perf_counter()
    requests.get(f"{url}/health", timeout=10).raise_for_status()
    return (time.perf_counter() - started) * 1000


def poll_health(url: str, stop: threading.Event, into: list[float]) -> None:
    """Time a health check ten times a second until `stop` is set."""
    while not stop.is_set():
        into.append(health_check_ms(url))
        stop.wait(0.1)


onnx_url = lab.fastapi_url("onnx")
health_idle_ms = [health_check_ms(onnx_url) for _ in range(10)]

health_loaded_ms: list[float] = []
stop_polling = threading.Event()
poller = threading.Thread(target=poll_health, args=(onnx_url, stop_polling, health_loaded_ms), daemon=True)
poller.start()
concurrent_onnx = lab.concurrent("onnx", 16, resources=ResourceSampler(interval_s=0.25, pids=listening_pids(onnx_url)))
stop_polling.set()
poller.join()
report(concurrent_onnx)

# %% [markdown]
# The three conditions, each judged on the numbers of the two runs (the sequential ONNX run above,
# and this one):

# %%
senders = concurrent_onnx.concurrency
onnx_health = requests.get(f"{onnx_url}/health", timeout=10).json()
slots = onnx_health["processes"] * onnx_health["slots"]  # every process's slots
stages = concurrent_onnx.service_stats["stage_mean_ms"]
print(f"Little's law, the whole system: {senders} / {concurrent_onnx.throughput_rps:.1f} req/s = "
      f"{1000 * senders / concurrent_onnx.throughput_rps:.1f} ms, the mean latency measured "
      f"{concurrent_onnx.latency.mean_ms:.1f} ms (a closed loop: the same thing, computed twice)")
print(f"The service's own mean per request: waiting for a slot {stages['slot_wait']:.1f} ms, decoding "
      f"{stages['preprocess']:.1f} ms, inference {stages['inference']:.1f} ms; {slots} slot(s)")
lab.record(fastapi_bench.queueing_under_load(sequential_onnx, concurrent_onnx, slots, lab.hardware()),
           predicted=predicted_queueing);
# %% [markdown]
# And the health checks that ran during those 16 senders, next to health checks on the idle service.
# A handler that blocked the event loop for an inference would hold a health check for what remains
# of the one running, half an inference on average: so under load, /health should answer within half
# an inference (the service's own mean) of its idle time. Where the slots were mostly idle, nothing
# could make it wait, and the check says NOT CHECKED.

# %%
print(f"/health: {len(health_idle_ms)} checks idle, {len(health_loaded_ms)} during the c={senders} run")
lab.record(fastapi_bench.health_stays_out_of_the_queue(health_idle_ms, health_loaded_ms, concurrent_onnx, slots,
                                                       lab.hardware()), predicted=predicted_health_free);
# %% [markdown]
# ### What the machine was doing
#
# The resources sampled during the 16-sender run. Locally there is no GPU, so the plot says so, and
# shows CPU: see how busy all cores were, and how much of that was the server process (the rest is
# the load generator, and anything else running on this machine).
#
# On the GPU node, the sampler reads the GPUs only if the container it runs in can see them (the
# plot's title says how they were read, or that none was found). If it found none, watch
# `nvtop` in your SSH session on the node while you re-run the 16-sender cell. Either way, ask of
# the GPU utilization: with one inference slot and one image per model call, is the GPU busy all
# the time, or does it sit idle between images while sixteen requests wait in line?

# %%
usage = summarize(concurrent_onnx.resources)
print(f"The whole machine: CPU {usage['cpu_percent_mean']}% of all {lab.cores} cores on average "
      f"(peak {usage['cpu_percent_max']}%); GPU: {', '.join(str(gpu) for gpu in usage['gpus']) or usage['gpu_source']}")
if "process_cpu_percent_mean" in usage:
    server = usage["process_cpu_percent_mean"]
    print(f"The server process alone: {server}% of one core on average, i.e. {server / lab.cores:.0f}% of all "
          f"{lab.cores} cores, the unit of the plot's thick line.")
plots.plot_resources(concurrent_onnx.resources, title=f"Resources during {concurrent_onnx.label}");
# %% [markdown]
# ## Threads are a resource: inference slots x threads per inference
#
# So far the service ran with its defaults. Two settings decide how it uses the CPU:
#
# - **inference slots** (`PREDICT_CONCURRENCY`): how many inferences may run at the same time;
# - **threads per inference** (`INFERENCE_THREADS`): how many threads one inference spreads over
#   (PyTorch's intra-op threads).
#
# Each running inference has its own team of threads, so the busy threads are the running
# inferences times their threads. When they outnumber the cores, the teams take turns on the
# cores, and every inference waits for the others. The lab's default never lets that happen: one
# slot per core, and *elastic* threads: an inference gets the cores divided by the inferences
# running when it starts. A request alone uses every core; under load, each slot has a core.
# `/health` states the plan a service runs.
#
# The next cell starts the PyTorch service four times, each with one plan in one process, on this machine
# (locally, or in the Jupyter container in Docker), and measures each one alone (one request at
# a time) and under load (four senders per core).
#
# **Expectation.** On a CPU:
#
# 1. with the same slots, more busy threads than cores make every request under load slower:
#    giving each slot every core is worse than giving each slot one;
# 2. a request alone is served faster with every core than with one;
# 3. the elastic default gets the best of both: within 15% of the best plan alone and under load.
#
# On a GPU the model runs on the GPU, and these plans only change how the CPU shares its other
# work: expect much smaller differences there, too small to judge, so there the three read NOT
# CHECKED.

# %%
from servelab.service.cores import available_cores

predicted_crowded_slower = None  # before you run: True if more busy threads than cores is slower, else False
predicted_elastic_near_best = None  # and True if the default plan is within 15% of the best, else False
cores = available_cores()
crowded = max(2, cores)  # slots, each with every core: more busy threads than cores
plans = {
    f"1 slot x {cores} threads": (1, cores),
    f"{cores} slots x 1 thread": (cores, 1),
    f"{crowded} slots x {cores} threads": (crowded, cores),
    "default (elastic)": (None, None),
}
senders = 4 * cores
alone, loaded = {}, {}
for name, (slots, threads) in plans.items():
    with lab.fastapi_variant("pt", slots, threads) as variant_url:
        plan_health = requests.get(f"{variant_url}/health", timeout=10).json()
        print(f"{name}: {plan_health['threads']}")
        alone[name] = lab.sequential("pt", url=variant_url, name=f"fastapi_pt, {name}")
        loaded[name] = lab.concurrent("pt", senders, url=variant_url, name=f"fastapi_pt, {name}")
device = plan_health["device"]
print(f"\nThe model ran on {device}; this process may use {cores} core(s).")

# %%
fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.5), sharey=True)
left.barh(list(plans), [alone[name].latency.p50_ms for name in plans], color="tab:blue")
left.set_xlabel("p50 latency, one request at a time (ms)")
right.barh(list(plans), [loaded[name].throughput_rps for name in plans], color="tab:orange")
right.set_xlabel(f"throughput with {senders} senders (req/s)")
left.invert_yaxis()
fig.suptitle(f"fastapi_pt on {device}, {cores} core(s): inference slots x threads per inference")
fig.tight_layout()
plt.show()

# %%
crowded_name, one_core = f"{crowded} slots x {cores} threads", f"{cores} slots x 1 thread"
every_core, default = f"1 slot x {cores} threads", "default (elastic)"
lab.record(fastapi_bench.crowded_threads_are_slower(loaded, crowded_name, one_core, crowded, cores, device,
                                                    lab.hardware()), predicted=predicted_crowded_slower)
lab.record(fastapi_bench.every_core_serves_one_faster(alone, every_core, one_core, cores, device, lab.hardware()))
near_best = fastapi_bench.elastic_default_near_the_best(alone, loaded, default, device, lab.hardware(),
                                                        sequential_pt.latency.p50_ms)
lab.record(near_best, predicted=predicted_elastic_near_best);

# %% [markdown]
# ## Processes: one interpreter, one lock
#
# Threads share one Python interpreter, and CPython runs Python code on one thread at a time: the
# *global interpreter lock* (GIL). The model's own work releases it, but HTTP, JSON and the
# service's scheduling hold it, so one process serves at most what its lock lets through, however
# many cores it has. The services therefore run several processes (uvicorn's *workers*, sharing the
# port), each on a share of the cores: `SERVICE_PROCESSES`, planned from the cores and the device.
# `/health` says how many.
#
# **Predict** before you run it: set `predicted_processes` to what you expect `processes_to_try`
# processes to serve against one, on this machine (say `"2x"`, or `"the same"`). Then run.

# %%
from servelab.service.cores import service_plan

processes_to_try = 2  # edit me: 2, 4...
predicted_processes = ""  # your words
plan = service_plan(cores, on_gpu=device.startswith("cuda"))
print(f"This machine: {cores} core(s); the plan: {plan.describe()}")
by_processes = {}
for count in (1, processes_to_try):
    with lab.fastapi_variant("onnx", SERVICE_PROCESSES=str(count)) as variant_url:
        serving = requests.get(f"{variant_url}/health", timeout=10).json()["processes"]
        print(f"{count} process(es) asked for: /health says {serving}")
        by_processes[count] = lab.concurrent("onnx", senders, url=variant_url,
                                             name=f"fastapi_onnx, {count} process(es)")
print(f"Measured: {by_processes[processes_to_try].throughput_rps:.1f} against {by_processes[1].throughput_rps:.1f} "
      "req/s")
lab.record(fastapi_bench.processes_follow_the_plan(by_processes[1], by_processes[processes_to_try], processes_to_try,
                                                   plan.processes, cores), predicted=predicted_processes);

# %% [markdown]
# ## Results
#
# Every run of this notebook, in one table, and every verdict above, in one list; then the latency
# distribution of each run: for each latency on the x-axis, the fraction of requests that were at
# least that fast. Where a curve crosses the dotted p50/p95/p99 lines is that run's percentile. The
# 16-sender curve sits far to the right of the sequential ones: that gap is the queueing delay. The
# next notebooks try to close it with Triton Inference Server: several model instances, and dynamic
# batching.

# %%
lab.table()
lab.verdicts();
# %%
plots.plot_latency_cdf(lab.results, log_x=True, title="FastAPI: latency per request, every run of this notebook");
# %% [markdown]
# ## Questions
#
# 1. With 16 senders, where did a request's time go (slot wait, decoding, inference)? Would a
#    faster model or more slots shorten it more, on this machine?
# 2. Which thread plan served worst under load, and why do more busy threads than cores hurt?
# 3. How close was your prediction for `processes_to_try`, and what limited the gain?
#
# **Hand in:** the results table, the latency plot and the slots x threads plot, with your
# predictions beside the verdicts.
#
# In Docker, leave the project running: Triton, in the next notebook, is already up beside FastAPI.
# Locally, the next cell stops the services this notebook started.

# %%
lab.stop()
