# %% [markdown]
# # 8. I/O outside the predict slot: fetching the photo by URL
#
# So far every request carried its photo. Real services often receive a *reference* instead: the
# photo sits in an object store (S3, Swift, a CDN), and the request says where. The server downloads
# it before the model runs, and may upload a result after. That I/O takes time but no model: where
# should it run?
#
# Serving frameworks such as Truss (Baseten's packaging of a model as a service) split a model's
# code into three parts:
#
# - **preprocess**: fetch and prepare the input, outside the predict slots. In this lab's service
#   (`fastapi_onnx/app.py`'s `/predict`, printed below): `fetch`, the download, asynchronous I/O on
#   the event loop, as many at once as arrive, before the request takes a slot.
# - **predict**: run the model, one request per **predict slot** at a time (a slot: one of the
#   `PREDICT_CONCURRENCY` inference threads, which decodes the photo it is given, then runs the
#   model). Here: `in_a_slot(request, classify, photo)`; a request waits in the threads' queue.
# - **postprocess**: turn the model's output into an answer (here `top_prediction`: softmax and
#   label), as many at once as arrive. Truss's example uploads a result there; here that upload
#   would run on the event loop after `in_a_slot` returns, the slot already free.
#
# The slots protect the model (its memory, its GPU); everything outside them runs freely. With one
# slot, S the slot's work for a request (decoding its photo, then the inference) and D the download:
#
# - download *inside* the slot (`IMAGE_DOWNLOAD_PLACEMENT=inside_slot`, the lines under `if` below):
#   the model idles while bytes travel, so at most one request per D + S seconds;
# - download *outside* it (the `else`): downloads overlap each other and the model, so with enough
#   requests in flight the slot is always busy, and the throughput approaches one request per S.
#
# **Where the cells run:** in Docker, in the Compose project's Jupyter container (its `image_host`
# service is the object store); locally, here. The service variants measured below run as
# processes next to this notebook.

# %%
import matplotlib.pyplot as plt
import requests

from servelab.lab import REPO_ROOT, Lab, plots
from servelab.lessons import io_vs_compute

lab = Lab.connect("8_io_vs_compute", triton=False)
print(f"The models run on {lab.hardware()}.")

# %%
app_py = (REPO_ROOT / "fastapi_onnx" / "app.py").read_text()  # the service's /predict, where the download runs
start = app_py.index('@app.post("/predict"')
print(app_py[start : app_py.index("\n\n\n", start)])

# %% [markdown]
# ## The object store: the lab's image host
#
# A real bucket in another region answers only after a network round trip. The lab's image host
# **emulates** that latency: it waits on purpose before answering, then sends the photo over this
# machine's loopback (or the Docker network). A URL can ask for another latency (`?latency_ms=...`).

# %%
host = requests.get(f"{lab.image_host_url}/health", timeout=10).json()
print(f"Image host at {lab.image_host_url}: emulated latency {host['emulated_latency_ms']:g} ms per download")
print("Photos:", ", ".join(f"{name} ({size} bytes)" for name, size in host["images"].items()))

# %% [markdown]
# ## One request by URL
#
# `POST /predict` takes exactly one of `{"image": "<base64>"}` and `{"url": "http(s)://..."}`. The
# server fetches only from the hosts it trusts (`IMAGE_URL_ALLOWED_HOSTS`): a server that fetches
# any URL a client names can be turned against the services behind it. The next cell sends one
# good URL and two the server must refuse.

# %%
service = lab.fastapi_url("onnx")
health = requests.get(f"{service}/health", timeout=10).json()
print(f"fastapi_onnx downloads {health['download_placement']}, from {health['image_url_allowed_hosts']}")
for url in (lab.image_url("soup.jpg"), f"{service}/health", "file:///etc/passwd"):
    answer = requests.post(f"{service}/predict", json={"url": url}, timeout=30)
    print(f"{url}\n  -> HTTP {answer.status_code}: {answer.json()}")

# %% [markdown]
# ## The experiment: the download inside vs outside the slot
#
# Two variants of the ONNX Runtime service, each with **one** predict slot (`PREDICT_CONCURRENCY=1`):
#
# - `outside_slot` (the default, the right design): download, decode, *then* wait for the slot;
# - `inside_slot` (the naive design): take the slot, then download, decode and infer.
#
# Each runs in closed loop (a sender sends its next request when the last is answered) at 1, 4 and
# 16 senders, every request naming the photo by URL, at two emulated download latencies. Each run
# also records the service's own metrics (`/metrics`): its mean download, slot wait, decoding and
# inference times: D, and S (decoding and inference) below.
#
# How many senders are *enough* to keep the slot busy with the download outside it? A request is
# in flight for about D + S, and in the slot for S, so about (D + S) / S must be in flight. The
# outside design is measured once more with half again that many (at least 16), computed from its
# run with one sender.
#
# **Expectation**, for each download latency:
#
# 1. inside the slot, more senders only lengthen the queue: from 4 to 16 senders the throughput
#    changes by less than 15%: the slot, held for the download too, is the limit (at most about
#    1 / (D + S), the dotted line of the plot below);
# 2. outside the slot, with 16 senders, the throughput is above that bound;
# 3. outside the slot, with enough senders, the throughput approaches 1 / S: the slot is busy at
#    least 70% of the time;
# 4. the server's metrics show why: with 16 senders, a request waits longer for the slot when the
#    download is inside it (behind other requests' downloads as well as their inferences).

# %%
predicted_gain_at_50ms = None  # before you run: 16 senders' requests/s, download outside the slot over inside (x),
predicted_gain_at_200ms = None  # at 50 ms and at 200 ms of download (both recorded two cells below)

# %%
LATENCIES_MS = (50, 200)
CONCURRENCIES = (1, 4, 16)
# Your turn: PLACEMENTS = (..., ...), the two values of the service's setting IMAGE_DOWNLOAD_PLACEMENT,
#   the download outside the predict slot first (docs/settings.md, IMAGE_DOWNLOAD_PLACEMENT).
### BEGIN SOLUTION
PLACEMENTS = ("outside_slot", "inside_slot")
### END SOLUTION
runs = {}  # (latency, placement) -> concurrency -> run
enough = {}  # latency -> the senders that keep the slot busy with the download outside it
for placement in PLACEMENTS:
    with lab.measurer.fastapi_variant("onnx", slots=1, IMAGE_DOWNLOAD_PLACEMENT=placement) as url:
        for latency_ms in LATENCIES_MS:
            photo = lab.image_url("soup.jpg", latency_ms=latency_ms)
            name = f"fastapi_onnx, 1 slot, download {placement}, host latency {latency_ms} ms (emulated)"
            measured_runs = runs[latency_ms, placement] = {
                c: lab.concurrent("onnx", c, url=url, image_url=photo, name=name) for c in CONCURRENCIES
            }
            if placement == "outside_slot":
                enough[latency_ms] = io_vs_compute.enough_senders(measured_runs[1], at_least=CONCURRENCIES[-1])
                print(f"  enough senders at {latency_ms} ms: {enough[latency_ms]}")
                if enough[latency_ms] not in measured_runs:
                    measured_runs[enough[latency_ms]] = lab.concurrent(
                        "onnx", enough[latency_ms], url=url, image_url=photo, name=name
                    )

# %% [markdown]
# What the servers measured, per run (mean milliseconds per request): the download (emulated
# latency plus transfer), the wait for the slot, decoding, and the inference.

# %%
print(f"{'run':<78} {'download':>9} {'slot wait':>10} {'decode':>7} {'infer':>6}")
for by_concurrency in runs.values():
    for c, run in by_concurrency.items():
        stages = run.service_stats["stage_mean_ms"]
        print(
            f"{run.name + f', c={c}':<78} {stages['download']:9.1f} {stages['slot_wait']:10.1f} "
            f"{stages['preprocess']:7.1f} {stages['inference']:6.1f}"
        )

# %% [markdown]
# The check, one per download latency, on the server's D and S in the run each condition judges.

# %%
top = CONCURRENCIES[-1]
bounds = {}
for latency_ms in LATENCIES_MS:
    inside, outside = runs[latency_ms, "inside_slot"], runs[latency_ms, "outside_slot"]
    inside_stages = inside[top].service_stats["stage_mean_ms"]
    bounds[f"host latency {latency_ms} ms (emulated)"] = {
        "1 / (D + S)": 1000 / (inside_stages["download"] + inside_stages["preprocess"] + inside_stages["inference"]),
        "1 / S": 1000 / sum(outside[enough[latency_ms]].service_stats["stage_mean_ms"][stage]
                            for stage in ("preprocess", "inference")),
    }
    lab.record(io_vs_compute.slot_holds_only_inference(inside, outside, enough[latency_ms], latency_ms, lab.hardware()),
               predicted={50: predicted_gain_at_50ms, 200: predicted_gain_at_200ms}[latency_ms])

# %% [markdown]
# Throughput against senders, both designs, one panel per download latency. Dotted: 1 / (D + S),
# the `inside_slot` bound (the server's D and S with 16 senders, as the verdicts use them). Dashed:
# 1 / S, from the `outside_slot` run with enough senders.

# %%
panels = {
    f"host latency {latency_ms} ms (emulated)": {
        placement.replace("_", " "): runs[latency_ms, placement] for placement in PLACEMENTS
    }
    for latency_ms in LATENCIES_MS
}
plots.plot_throughput_bounds(panels, bounds, title="fastapi_onnx, one predict slot: where the download runs")
plt.show()

# %% [markdown]
# Read the plot against the expectation: inside the slot, the curve should stay near 1 / (D + S);
# outside, it should rise until the slot is busy (the model, not the network, is then the limit),
# later with the longer download, which needs more requests in flight to hide it. Where your run
# differs, the verdicts say which condition failed.
#
# ## Truss's case: 10 requests at once on 5 slots
#
# Truss's documentation takes 5 predict slots and 10 requests: all 10 begin preprocessing, and the
# 6th waits for a slot. The variant below has 5 slots. Ten requests by URL go at once, after a
# warm-up burst, each with an emulated download of `BURST_LATENCY_MS`: long beside S, so a wait
# behind a download would stand out.
#
# **Expectation**, from the service's metrics: all 10 are downloaded (at once, outside the slots),
# decoded and inferred; the 5 beyond the slots wait about one decoding and inference each, so the
# mean slot wait W is at least about S / 2 and well below (D + S) / 2, its mean if the downloads
# waited behind the slots. Counts and means cannot show how many inferred at once: the pool of 5
# slot threads bounds that.

# %%
predicted_slot_wait_ms = None  # before you run: the mean slot wait W of the 10 requests (ms)

# %%
SENT, SLOTS, BURST_LATENCY_MS = 10, 5, 1000
with lab.measurer.fastapi_variant("onnx", slots=SLOTS) as url:
    health = requests.get(f"{url}/health", timeout=10).json()
    print(f"{health['slots']} slots: {health['threads']}")
    burst = lab.burst(
        "onnx", SENT, url=url, image_url=lab.image_url("soup.jpg", latency_ms=BURST_LATENCY_MS),
        name=f"fastapi_onnx, {SLOTS} slots, {SENT} requests at once, host latency {BURST_LATENCY_MS} ms (emulated)",
    )
stages = burst.service_stats
print("requests per stage:", stages["stage_counts"])
print("mean ms per stage: ", {name: round(ms, 1) for name, ms in stages["stage_mean_ms"].items()})
lab.record(io_vs_compute.burst_waits_only_for_slots(burst, SENT, health["slots"]),
           predicted=predicted_slot_wait_ms);

# %% [markdown]
# ## All the runs, and the verdicts

# %%
lab.table()
lab.verdicts();

# %% [markdown]
# ## Questions
#
# 1. With the download inside the slot, what limited the throughput as senders were added? Use the
#    server's slot wait to explain it.
# 2. Why does a longer download need more senders before the `outside_slot` curve flattens? Did
#    yours?
# 3. In the burst, what did the requests beyond the slots wait for, and what did they not wait for?
#
# **Hand in:** the results table, the stage table and the throughput plot, with your predictions
# beside the verdicts.

# %% [markdown]
# Locally, the next cell stops the services this notebook started (in Docker it does nothing: the
# containers keep running until you bring them down).

# %%
lab.stop()
