"""What Triton itself says it did: its per-model statistics, read before and after a run.

Triton keeps cumulative counters for every model since it loaded it, at
`GET /v2/models/<model>/stats` (the KServe v2 statistics extension). Two snapshots and their
difference tell, for exactly the requests of one run:

- how many inferences (images) and how many executions (model runs) there were: their ratio is
  the average batch size the server really ran, so it shows whether dynamic batching happened;
- how many executions ran at each batch size (`batch_stats`);
- where a request's time went inside the server: waiting in the queue, preparing inputs, running
  the model, collecting outputs.

The counters cover every client, so a run measures only its own requests when nothing else is
sending to that model at the same time.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import requests

from servelab.polling import settled
from servelab.results import StepCounts


class TritonStatsError(RuntimeError):
    """The statistics could not be read, or two snapshots cannot be compared."""


@dataclass
class StatsDelta:
    """Difference of two statistics snapshots of one model: what happened in between.

    Averages are in microseconds, per request that went through that stage, which is per
    successful request unless Triton's response cache answered some (cache hits are queued but
    not computed). An average over no requests is NaN, like an empty `LatencySummary`.
    """

    model: str
    inference_count: int  # inferences (images): a request with 3 images counts 3
    execution_count: int  # model executions: one per batch the backend ran
    success_count: int  # successful requests
    fail_count: int  # failed requests
    avg_request_us: float  # whole time a successful request spent inside the server
    avg_queue_us: float
    avg_compute_input_us: float
    avg_compute_infer_us: float
    avg_compute_output_us: float
    executions_by_batch_size: dict[int, int] = field(default_factory=dict)
    avg_batch_size: float = math.nan  # inference_count / execution_count
    # The executions' own compute time (batch_stats) per inference: what one inference cost the
    # model, a batch's time shared among its inferences.
    compute_ms_per_inference: float = math.nan
    # The same, for the executions of each batch size: what an image cost in a batch of that size.
    compute_ms_per_inference_by_batch_size: dict[int, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _base_url(address: str) -> str:
    """Accept "host:port", as tritonclient does, or a full http(s) URL."""
    address = address.rstrip("/")
    return address if address.startswith(("http://", "https://")) else f"http://{address}"


def fetch(address: str, model: str, version: str | None = None, timeout_s: float = 10.0) -> dict[str, Any]:
    """The raw statistics response of `model` (all its loaded versions unless `version` is given)."""
    path = f"/v2/models/{model}" + (f"/versions/{version}" if version else "") + "/stats"
    url = _base_url(address) + path
    try:
        response = requests.get(url, timeout=timeout_s)
    except requests.RequestException as exc:
        raise TritonStatsError(f"cannot read Triton statistics at {url}: {exc}") from exc
    if response.status_code != 200:
        # Triton answers an unknown model with 400 and {"error": "requested model '...' is not available"}.
        try:
            reason = response.json()["error"]
        except (ValueError, KeyError, TypeError):
            reason = response.text.strip() or response.reason
        raise TritonStatsError(
            f"Triton at {address} has no statistics for model '{model}'"
            + (f" version {version}" if version else "")
            + f" (HTTP {response.status_code}: {reason})"
        )
    return response.json()


def _model_stat(snapshot: dict[str, Any]) -> dict[str, Any]:
    """The one `model_stats` entry of a snapshot from `fetch`."""
    entries = snapshot.get("model_stats", [])
    if len(entries) != 1:
        names = [f"{entry.get('name')} v{entry.get('version')}" for entry in entries]
        raise TritonStatsError(
            f"expected statistics of exactly one model version, got {len(entries)} ({', '.join(names)});"
            " pass version= to fetch() when several versions are loaded"
        )
    return entries[0]


def _duration(stats: dict[str, Any], name: str) -> tuple[int, int]:
    """(count, ns) of one duration statistic; absent means none recorded."""
    value = stats.get(name) or {}
    return int(value.get("count", 0)), int(value.get("ns", 0))


def _average_us(before: dict[str, Any], after: dict[str, Any], name: str) -> float:
    count_before, ns_before = _duration(before, name)
    count_after, ns_after = _duration(after, name)
    count = count_after - count_before
    return (ns_after - ns_before) / count / 1000 if count else math.nan


def _execution_compute_ns(model_stat: dict[str, Any]) -> int:
    return sum(_duration(entry, "compute_infer")[1] for entry in model_stat.get("batch_stats", []))


def _batches(model_stat: dict[str, Any]) -> dict[int, tuple[int, int]]:
    """Batch size -> (executions, their compute ns)."""
    return {int(entry["batch_size"]): _duration(entry, "compute_infer") for entry in model_stat.get("batch_stats", [])}


def diff(before: dict[str, Any], after: dict[str, Any]) -> StatsDelta:
    """What happened between two `fetch` snapshots of the same model (before taken first)."""
    old, new = _model_stat(before), _model_stat(after)
    if (old.get("name"), old.get("version")) != (new.get("name"), new.get("version")):
        raise TritonStatsError(
            f"snapshots of different models: {old.get('name')} v{old.get('version')}"
            f" and {new.get('name')} v{new.get('version')}"
        )
    inferences = int(new["inference_count"]) - int(old["inference_count"])
    executions = int(new["execution_count"]) - int(old["execution_count"])
    if inferences < 0 or executions < 0:
        # Counters only grow while a model stays loaded; a reload starts them from zero again.
        raise TritonStatsError(
            f"statistics of '{new.get('name')}' went backwards: the model was reloaded between the snapshots"
        )
    old_infer, new_infer = old.get("inference_stats", {}), new.get("inference_stats", {})
    old_batches, new_batches = _batches(old), _batches(new)
    by_batch_size = {
        size: count - old_batches.get(size, (0, 0))[0]
        for size, (count, _) in sorted(new_batches.items())
        if count > old_batches.get(size, (0, 0))[0]
    }
    per_inference_by_batch_size = {
        size: (new_batches[size][1] - old_batches.get(size, (0, 0))[1]) / 1e6 / (count * size)
        for size, count in by_batch_size.items()
    }
    return StatsDelta(
        model=str(new.get("name")),
        inference_count=inferences,
        execution_count=executions,
        success_count=_duration(new_infer, "success")[0] - _duration(old_infer, "success")[0],
        fail_count=_duration(new_infer, "fail")[0] - _duration(old_infer, "fail")[0],
        avg_request_us=_average_us(old_infer, new_infer, "success"),
        avg_queue_us=_average_us(old_infer, new_infer, "queue"),
        avg_compute_input_us=_average_us(old_infer, new_infer, "compute_input"),
        avg_compute_infer_us=_average_us(old_infer, new_infer, "compute_infer"),
        avg_compute_output_us=_average_us(old_infer, new_infer, "compute_output"),
        executions_by_batch_size=by_batch_size,
        avg_batch_size=inferences / executions if executions else math.nan,
        compute_ms_per_inference=(_execution_compute_ns(new) - _execution_compute_ns(old)) / 1e6 / inferences
        if inferences
        else math.nan,
        compute_ms_per_inference_by_batch_size=per_inference_by_batch_size,
    )


@dataclass
class Snapshots:
    """A model's statistics read before and after a block of code; `delta` is set when the block
    ends without an error."""

    address: str
    model: str
    before: dict[str, Any]
    after: dict[str, Any] | None = None
    delta: StatsDelta | None = None


@contextmanager
def counted_over(address: str, model: str, version: str | None = None) -> Iterator[Snapshots]:
    """Triton's counters of `model` read before and after the `with` block, and their difference
    (it sends nothing itself: the block's requests are what it counts):

    with triton_stats.counted_over("127.0.0.1:8200", "food_classifier") as stats:
        run_load()
    print(stats.delta.avg_batch_size)
    """
    # Settled before too: a request answered just before the block is counted a moment later, and
    # would otherwise be counted as the block's.
    snapshots = Snapshots(address, model, before=fetch_settled(address, model, version))
    # No snapshot after an error in the block: reading the server again could hide that error.
    yield snapshots
    snapshots.after = fetch_settled(address, model, version)
    snapshots.delta = diff(snapshots.before, snapshots.after)


def fetch_settled(address: str, model: str, version: str | None = None, timeout_s: float = 2.0) -> dict[str, Any]:
    """Like `fetch`, once the counters have stopped moving.

    Triton records a request's statistics just after sending its response, so a snapshot taken
    the moment the last answer arrives can miss that request.
    """
    return settled(lambda: fetch(address, model, version), timeout_s)


def log_since(log: Path, offset: int) -> str:
    """The text a log file gained after its first `offset` bytes (read before a run: its size)."""
    with log.open("rb") as file:
        file.seek(offset)
        return file.read().decode(errors="replace")


def cancelled_by_model(log_text: str, model: str) -> int:
    """Requests the lab's Python-backend `model` answered CANCELLED instead of computing them, as
    its log lines say. Triton's statistics count those requests as successes."""
    return sum(int(count) for count in re.findall(rf"{re.escape(model)}: (\d+) cancelled request\(s\)", log_text))


def refine_steps(log_text: str, model: str) -> StepCounts:
    """The steps the lab's decoupled `model` (food_refine) computed, as its log lines count them
    (one as each stream starts, one as it ends): steps computed, those computed after the client
    had cancelled, and the streams started but not ended (running; or cut short by a crash)."""
    name = re.escape(model)
    started = len(re.findall(rf"{name}: a stream of \d+ steps started", log_text))
    ended = re.findall(rf"{name}: (\d+) of \d+ steps computed, (\d+) after the client cancelled", log_text)
    return StepCounts(
        computed=sum(int(computed) for computed, _ in ended),
        for_gone_clients=sum(int(for_nobody) for _, for_nobody in ended),
        running=started - len(ended),
    )


# Where a request was when its gRPC cancellation was handled, as Triton's verbose log says
# (src/grpc/infer_handler.h): START (not yet read), ISSUED (in the queue or in the model),
# COMPLETE (its answer being written), FINISH (its answer sent).
_CANCELLATION_STEP = re.compile(r"Cancellation notification received for \w+, rpc_ok=\d, context \d+, \d+ step (\w+)")


def cancellation_steps(log_text: str) -> dict[str, int]:
    """How many gRPC cancellations Triton handled at each step of their request, from its log at
    verbose level 1 (`update_log_settings({"log_verbose_level": 1})`); empty at the default level."""
    steps: dict[str, int] = {}
    for step in _CANCELLATION_STEP.findall(log_text):
        steps[step] = steps.get(step, 0) + 1
    return steps


SEQUENCE_EVENTS = ("evicted", "expired", "timed out", "cancelled", "refused")


def sequence_events(log_text: str, model: str) -> dict[str, int]:
    """What the lab's stateful `model` (food_sequence) did to its sequences, as its log lines
    count them: sequences whose state it dropped (evicted, expired, timed out, cancelled) and
    requests it refused because their sequence had no state. Every kind is present, 0 if none."""
    counts = dict.fromkeys(SEQUENCE_EVENTS, 0)
    kinds = "|".join(SEQUENCE_EVENTS)
    for kind, count in re.findall(rf"{re.escape(model)}: ({kinds}) (\d+) (?:sequence|request)\(s\)", log_text):
        counts[kind] += int(count)
    return counts


_STAGE_SAMPLE = re.compile(r"^lab_model_stage_us\{([^}]*)\} (\S+)$", re.M)
_LABEL = re.compile(r'(\w+)="([^"]*)"')


def stage_times_us(metrics_text: str, model: str) -> dict[tuple[str, str], float]:
    """The time `model` spent in each of its own stages, by (stage, process), in microseconds since
    each instance's process started: Triton's custom metric lab_model_stage_us, labelled by model, stage
    and process, which a model that times its stages reports (food_classifier's model.py). Empty for a
    model that does not."""
    found = {}
    for labels_text, value in _STAGE_SAMPLE.findall(metrics_text):
        labels = dict(_LABEL.findall(labels_text))
        if labels.get("model") == model:
            found[labels["stage"], labels["process"]] = float(value)
    return found


def stage_mean_ms(
    before: dict[tuple[str, str], float], after: dict[tuple[str, str], float], executions: int
) -> dict[str, float]:
    """Each stage's time per execution between two readings of `stage_times_us`: an instance that
    started in between counts from zero, one that ended in between is left out (its time is gone
    with its process)."""
    totals: dict[str, float] = {}
    for (stage, process), value in after.items():
        totals[stage] = totals.get(stage, 0.0) + value - before.get((stage, process), 0.0)
    return {stage: total / 1000 / executions for stage, total in totals.items()} if executions else {}
