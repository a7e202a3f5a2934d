# %% [markdown]
# # 4. Benchmarking the FastAPI service
#
# You send the FastAPI service of notebook 3 a real request, follow one photo through GourmetGram,
# then measure: **one** user (PyTorch, then ONNX Runtime), **sixteen** users at once (where does the
# extra time go?), and ways to share the cores (threads per inference, processes).
#
# **Where the cells run:** as in notebook 3. Numbers differ between a GPU node and a laptop: the
# *trends* are the lesson.
#
# **Watch the GPU** on the node: in a terminal, `ssh cc@<the node's floating IP>` (notebook 2 printed
# it), then `nvtop`, beside this notebook: each run shows there as GPU use and memory.

# %%
import base64
import json

import matplotlib.pyplot as plt
import requests

from servelab.lab import Lab, plots
from servelab.lessons import fastapi_bench

lab = Lab.connect("4_fastapi_bench", triton=False)  # these notebooks use FastAPI only

# %% [markdown]
# ## The API's own documentation: `/docs`
#
# FastAPI builds a documentation page (*Swagger UI*) from `app.py`'s request and response
# models. Open it (the cell prints where), click **POST /predict**, then **Try it out**.

# %%
for flavor in ("pt", "onnx"):
    print(f"FastAPI ({flavor}), in your browser: {lab.fastapi_url(flavor).browser}/docs")

# %% [markdown]
# The page is drawn from `/openapi.json`, a machine-readable description of the API (the *OpenAPI*
# standard). Here is what it says about `/predict`: the body it accepts, and each answer it can give.

# %%
fastapi_url = lab.fastapi_url("pt")
openapi = requests.get(f"{fastapi_url}/openapi.json", timeout=10).json()
print(fastapi_bench.describe_predict(openapi))

# %% [markdown]
# ## One real request
#
# The body carries the sample photo as a base64 string. To try it on the Swagger page, run
# `print(image_b64)` in a new cell and paste the output in place of `"string"`.

# %%
image_bytes = lab.sample_image()  # GourmetGram's soup.jpg
image_b64 = base64.b64encode(image_bytes).decode()
body = json.dumps({"image": image_b64})
print(
    f"The photo: {len(image_bytes)} bytes as a file, {len(image_b64)} characters in base64 "
    f"({len(image_b64) / len(image_bytes):.2f}x the file)"
)
print(f"JSON body, {len(body)} characters: {body[:60]}...{body[-12:]}")
response = requests.post(f"{fastapi_url}/predict", data=body, headers={"Content-Type": "application/json"}, timeout=60)
response.raise_for_status()
api_answer = response.json()
print(f"FastAPI (PyTorch) answered: {api_answer}")

# %% [markdown]
# ## The whole path: GourmetGram in front
#
# GourmetGram forwards an uploaded photo to FastAPI and renders the answer as HTML; the cell
# uploads one as a browser would and reads the label.

# %%
ui = lab.ui("fastapi_pt")

ui_answer = ui.upload("soup.jpg")
print(f"Same label as the direct API call: {ui_answer.label == api_answer['prediction']}")

# %% [markdown]
# **Expectation.** GourmetGram's three samples are drawn cartoons. With trained weights, each gets
# the class its name says. Why might a model trained on photographs miss a cartoon? With untrained
# weights the check reads NOT CHECKED.

# %%
predicted_labels = None  # before you run this cell: True if every sample gets its name's class, else False
served_weights = requests.get(f"{lab.fastapi_url('pt')}/health", timeout=10).json()["weights"]
print(f"FastAPI (PyTorch) /health: {served_weights} weights")
sample_pages = {}
for photo in ui.samples():
    page = ui.upload(photo)
    sample_pages[photo] = (page.label, page.probability)
lab.record(fastapi_bench.samples_get_their_labels(sample_pages, served_weights), predicted=predicted_labels);

# %% [markdown]
# ## How fast for one user? A load loop of your own
#
# `requests` sends the photo, a pool of K threads (`ThreadPoolExecutor`) keeps K requests in
# flight, and each is timed. With one thread, none waits behind another: the time to *serve* one
# (HTTP, JSON, decoding, preprocessing, the model, the way back).
#
# - **p50** (the median) is the typical request; **p95** and **p99** are the tail (5% and 1% are
#   slower), which users notice.
# - **Throughput**: requests answered per second; one at a time, 1000 / mean latency in ms.

# %%
import statistics
import time
from concurrent.futures import ThreadPoolExecutor


def timed_request(_) -> float:
    started = time.perf_counter()
    answer = requests.post(f"{fastapi_url}/predict", data=body, headers={"Content-Type": "application/json"},
                           timeout=60)
    answer.raise_for_status()
    return 1000 * (time.perf_counter() - started)  # ms


for threads in (1, 16):
    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=threads) as pool:
        latencies_ms = list(pool.map(timed_request, range(100)))  # 100 requests, `threads` at a time
    elapsed_s = time.perf_counter() - started
    p95_ms = statistics.quantiles(latencies_ms, n=20)[-1]
    print(f"{threads:2} thread(s): median {statistics.median(latencies_ms):.1f} ms, p95 {p95_ms:.1f} ms, "
          f"{len(latencies_ms) / elapsed_s:.1f} req/s")

# %% [markdown]
# The lab's load generator measures from here, one request at a time first: a client of Python
# threads can itself be the bottleneck (its HTTP and JSON work share one interpreter lock); the
# lab's watches its own schedule and says when it fell behind.

# %%
sequential_pt = lab.sequential("pt")
lab.table([sequential_pt])
print(f"1000 / mean latency = {1000 / sequential_pt.latency.mean_ms:.1f} req/s")

# %% [markdown]
# ## Switch to ONNX Runtime
#
# PyTorch's *eager* mode runs one operator at a time as Python calls it; ONNX Runtime optimises
# the whole graph ahead of time (fusing layers, folding constants), so an inference usually takes
# less time. The verdict compares medians and, from each
# service's own timing (`/metrics`), how much of a request the model call was.

# %%
predicted_onnx_speedup = None  # before you run: PyTorch's median latency over ONNX Runtime's, one at a time (x)

# %%
onnx_url = lab.fastapi_url("onnx")
onnx_runtime = requests.get(f"{onnx_url}/health", timeout=10).json()["runtime"]
print(f"ONNX Runtime service: {onnx_url} ({onnx_runtime})")
sequential_onnx = lab.sequential("onnx")
lab.table([sequential_pt, sequential_onnx]);

# %%
lab.record(fastapi_bench.runtime_comparison(sequential_pt, sequential_onnx), predicted=predicted_onnx_speedup);

# %% [markdown]
# ## Sixteen users at once
#
# 16 *senders* (clients) each send a request as soon as their last is answered: a *closed loop*,
# always 16 requests in the system. At most one image per **inference slot** (notebook 3) is in
# the model; the others wait. With one sender the cores idle between requests; with 16, decoding
# overlaps the model's work and throughput rises, up to what the cores can do.
#
# - **Little's law:** requests in a system = throughput × time each spends there. For the closed
#   loop it cannot fail (mean latency *is* 16 / throughput). For the slots it tells us something:
#   throughput × one inference's time = slots busy on average.
# - **Queueing delay:** time spent waiting, here for a slot. No faster model removes it, only more
#   capacity or fewer requests.
#
# **Expectation.** With 16 senders:
#
# 1. throughput rises above the one-at-a-time throughput;
# 2. the slots are busy at least 90% of the time (throughput × mean inference time ≥ 0.9 × slots);
# 3. the mean wait for a slot is more than half the mean latency.
#
# Meanwhile a sampler records CPU (and GPU) and a thread times `/health`, which does no model work:
# the event loop only *awaits* slots (notebook 3), so it should not wait behind predictions. On a
# GPU, with one image per model call, the GPU itself should have time to spare.
#
# Where the model runs decides which questions this notebook asks here:

# %%
device = requests.get(f"{fastapi_url}/health", timeout=10).json()["device"]
plans = fastapi_bench.CorePlans(device)  # the cores this process may use, shared by threads and by processes
print(plans.describe())

# %%
predicted_load_gain = None  # before you run: the requests/s of 16 senders over one at a time (x)
predicted_health_ms = None  # and /health's median while the 16 senders run (ms)

# %% tags=["gpu_only"]
# On a GPU: before you run, the GPU's mean use during the 16-sender run (%, as nvtop shows it)
predicted_gpu_use = None

# %%
with fastapi_bench.LoadWatch(onnx_url) as watch:  # /health timed idle, then during the run
    concurrent_onnx = lab.concurrent("onnx", 16, resources=watch.sampler)
lab.table([concurrent_onnx]);

# %% [markdown]
# The three conditions, judged on the sequential ONNX run and this one:

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
lab.record(fastapi_bench.queueing_under_load(sequential_onnx, concurrent_onnx, slots), predicted=predicted_load_gain);
# %% [markdown]
# A handler that blocked the event loop would hold `/health` for the rest of the running inference,
# half of one on average. So under load it should answer within half an inference of its idle
# time (NOT CHECKED where the slots were mostly idle).

# %%
print(f"/health: {len(watch.idle_ms)} checks idle, {len(watch.loaded_ms)} during the c={senders} run")
lab.record(fastapi_bench.health_stays_out_of_the_queue(watch.idle_ms, watch.loaded_ms, concurrent_onnx, slots),
           predicted=predicted_health_ms);
# %% [markdown]
# ### What the machine was doing
#
# Locally: CPU only, and the server's share of it (the rest is the load generator). On the GPU
# node, if the title says no GPU was found, watch `nvtop` while you re-run the 16-sender cell. With
# the slots printed above (each process has its own) and one image per model call, is the GPU busy,
# or idle between images while sixteen requests wait?

# %%
watch.show_resources(concurrent_onnx.label)  # what its sampler saw: in words, then over time

# %% tags=["gpu_only"]
if not plans.threads:  # on a GPU: how busy it stayed
    lab.record(fastapi_bench.gpu_has_time_to_spare(concurrent_onnx, onnx_health["device"]), predicted=predicted_gpu_use)
# %% [markdown]
# ## Threads are a resource: inference slots × threads per inference
#
# - **inference slots** (`PREDICT_CONCURRENCY`): how many inferences run at once;
# - **threads per inference** (`INFERENCE_THREADS`): PyTorch's *intra-op* threads, which split one
#   operator's work.
#
# Busy threads = running inferences × their threads. With more than the cores, they take turns and
# every inference waits for the others. The default (the plan at the top of `app.py`): one slot per
# core, one thread each. The cell serves each plan, in one process, alone (one request at a time)
# and under load (four senders per core).
#
# **Expectation.** On a CPU:
#
# 1. with the same slots, more busy threads than cores make requests under load slower;
# 2. a request alone is served faster with every core than with one;
# 3. the default is within 15% of the best plan, alone and under load.
#
# On a GPU these plans only share the CPU's other work: there the cells skip them, as said above.

# %% tags=["cpu_only"]
# On a CPU:
predicted_crowded_rate = None  # before you run: the crowded plan's requests/s under load over 1 thread each's (x)
predicted_every_core = None  # and one request's median with every core over one thread's (x)
predicted_default_share = None  # and the default plan's requests/s under load over the best plan's (x)

# %%
cores, senders = plans.cores, 4 * plans.cores  # four senders per core, here and for the processes below

# %% tags=["cpu_only"]
alone, loaded = {}, {}
for name, (slots, threads) in plans.threads.items():  # name -> (slots, threads); None: the default
    with lab.measurer.fastapi_variant("pt", slots, threads) as variant_url:
        plan_health = requests.get(f"{variant_url}/health", timeout=10).json()
        print(f"{name}: {plan_health['threads']}")
        alone[name] = lab.sequential("pt", url=variant_url, name=f"fastapi_pt, {name}")
        loaded[name] = lab.concurrent("pt", senders, url=variant_url, name=f"fastapi_pt, {name}")

# %% tags=["cpu_only"]
if plans.threads:
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.5), sharey=True)
    left.barh(list(alone), [run.latency.p50_ms for run in alone.values()], color="tab:blue")
    left.set_xlabel("p50 latency, one request at a time (ms)")
    right.barh(list(loaded), [run.throughput_rps for run in loaded.values()], color="tab:orange")
    right.set_xlabel(f"throughput with {senders} senders (req/s)")
    left.invert_yaxis()
    fig.suptitle(f"fastapi_pt on {device}, {cores} core(s): inference slots x threads per inference")
    fig.tight_layout()
    plt.show()
    lab.record(fastapi_bench.crowded_threads_are_slower(loaded, plans), predicted=predicted_crowded_rate)
    lab.record(fastapi_bench.every_core_serves_one_faster(alone, plans), predicted=predicted_every_core)
    lab.record(fastapi_bench.default_near_the_best(alone, loaded, plans, sequential_pt.latency.p50_ms),
               predicted=predicted_default_share);

# %% [markdown]
# ## Processes: one interpreter, one lock
#
# CPython runs Python code on one thread at a time per process: the *global interpreter lock*
# (GIL). The model releases it, but HTTP and JSON hold it, so one process serves at most what its
# lock lets through. The services therefore run several processes (*workers* of uvicorn, the
# server that runs the app, sharing one port), each on a share of the cores: uvicorn's
# `WEB_CONCURRENCY`, planned from the cores and the device at the top of `app.py`.
#
# **Predict:** set `predicted_processes` to how many times one process's requests per second
# `processes_to_try` processes serve (`2.0`, or `1.0` for the same).

# %%
predicted_processes = None  # before you run: a number

# %%
# Your turn: processes_to_try = ..., the processes (uvicorn's workers, WEB_CONCURRENCY) to compare
#   with one: 2, 4... (the setting: docs/settings.md, WEB_CONCURRENCY).
### BEGIN SOLUTION
processes_to_try = 2
### END SOLUTION
print(f"This machine: {cores} core(s); the plan: {plans.service.describe()}")
by_processes = {}
for count in (1, processes_to_try):
    with lab.measurer.fastapi_variant("onnx", WEB_CONCURRENCY=str(count)) as variant_url:
        serving = requests.get(f"{variant_url}/health", timeout=10).json()["processes"]
        print(f"{count} process(es) asked for: /health says {serving}")
        by_processes[count] = lab.concurrent("onnx", senders, url=variant_url,
                                             name=f"fastapi_onnx, {count} process(es)")
        if count == processes_to_try:  # how a load spreads over them: 16 clients, then 64
            spread = [lab.concurrent("onnx", clients, url=variant_url,
                                     name=f"fastapi_onnx, {count} process(es), {clients} senders")
                      for clients in (16, 64)]
print(f"Measured: {by_processes[processes_to_try].throughput_rps:.1f} against {by_processes[1].throughput_rps:.1f} "
      "req/s")
lab.record(fastapi_bench.processes_follow_the_plan(by_processes[1], by_processes[processes_to_try],
                                                   processes_to_try, plans), predicted=predicted_processes);

# %% [markdown]
# **How the load spread.** The last column is each process's own count: connections, then requests
# answered. The processes share one listening socket: a connection goes to whichever accepts first
# and stays. So 16 clients can leave a process idle; 64 spread wider: `make test-gpu` judges at 64.

# %%
lab.table(spread);

# %% [markdown]
# ## Results
#
# Every run and verdict; then the *CDF* of the one-user and 16-sender runs: for each latency on the
# x-axis, the fraction of requests at least that fast (dotted: p50, p95, p99). The gap between the
# 16-sender curve and the sequential ones is queueing delay, which Triton, next, tries to close.

# %%
lab.table()
lab.verdicts();
# %%
plots.plot_latency_cdf([sequential_pt, sequential_onnx, concurrent_onnx], log_x=True,
                       title="FastAPI: latency per request, one user and sixteen");
# %% [markdown]
# ## Questions
#
# For what ran on this machine (the thread plans on a CPU, the GPU's use on a GPU):

# %%
print(plans.questions())

# %% [markdown]
# In Docker, leave the project running. Locally, the next cell stops this notebook's services.

# %%
lab.stop()
