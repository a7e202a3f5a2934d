"""One record type for every measurement the lab makes, whoever made it.

The lab's load generator, perf_analyzer and the in-process baseline all produce a `RunResult`,
so a table, a plot or a comparison never has to care which tool measured. A run of sequences (a
stateful model, frame after frame) is a `SequenceRunResult`: the same record, whose requests are
frames, plus what happened to the sequences. Results are saved as JSON (raw latencies included,
for CDF plots) and can be loaded back to compare runs: a whole set at once (`save_results`, the
benchmark's report), or one run at a time as each ends (`append_result`, every notebook run).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from servelab import jsonl


@dataclass
class LatencySummary:
    """Latency statistics in milliseconds."""

    mean_ms: float
    p50_ms: float
    p90_ms: float
    p95_ms: float
    p99_ms: float
    max_ms: float
    std_ms: float = math.nan  # standard deviation

    @classmethod
    def of(cls, latencies_ms: list[float] | np.ndarray) -> LatencySummary:
        values = np.asarray(latencies_ms, dtype=float)
        if values.size == 0:
            return cls(*(math.nan,) * 7)
        p50, p90, p95, p99 = np.percentile(values, [50, 90, 95, 99])
        mean, highest, std = float(values.mean()), float(values.max()), float(values.std())
        return cls(mean, float(p50), float(p90), float(p95), float(p99), highest, std)


def percentile_known(percentile: float, requests: int) -> bool:
    """Whether `requests` say anything about the `percentile`: at least one request must lie beyond it
    (p99 needs 100 requests, p95 20). Below that the "p99" is just the slowest request seen."""
    return requests * (1 - percentile / 100) >= 1


@dataclass
class RunResult:
    name: str  # what was measured, e.g. "fastapi_onnx" or "triton/food_classifier_onnx (grpc)"
    tool: str  # "loadgen", "perf_analyzer" or "in-process"
    mode: str  # "closed" (N concurrent senders), "open" (requests at a set rate) or "sequences"
    requests: int  # measured requests that completed, successful or not (warm-up excluded)
    throughput_rps: float  # successful requests per second of measurement (see images_per_s)
    latency: LatencySummary
    wall_s: float  # length of the measurement (warm-up excluded)
    concurrency: int | None = None
    rate_rps: float | None = None  # offered rate (open loop)
    arrival: str | None = None  # "constant" or "poisson" (open loop)
    batch_size: int = 1
    errors: dict[str, int] = field(default_factory=dict)  # error kind -> count
    cancelled: int = 0  # requests their client gave up on and cancelled (not errors, not answered)
    impatient: int = 0  # closed loop: senders (of `concurrency`) that give up after a deadline
    patient_latency: LatencySummary | None = None  # answers to the senders without a deadline
    latencies_ms: list[float] = field(default_factory=list)  # raw, successful requests only
    # Every measured request as it ended: [seconds since the measurement began, its latency in ms
    # (a failure's too: how long until it failed; None for one never sent), "ok" or the error
    # kind]; what a time axis is drawn from (loadgen only).
    timeline: list[list] = field(default_factory=list)
    # How late the generator acted against its schedule (servelab.loadgen.lag): an open loop's
    # sends against their arrival times; the other runs' event loop against a timer it keeps.
    schedule_lag: dict[str, Any] | None = None
    # perf_analyzer: server-side breakdown, microseconds (queue, compute input/infer/output...).
    server_breakdown: dict[str, float] | None = None
    triton_stats: dict[str, Any] | None = None  # difference of /v2/models/<m>/stats over the run
    service_stats: dict[str, Any] | None = None  # difference of a FastAPI service's /metrics over the run
    # A streamed run (servelab.loadgen.streams): "asked" (steps per stream), "leave_after_steps" and
    # "patience_s" (when the impatient senders left), "received" (the steps each stream got, in the
    # order they ended); and from the server's own account over the run (servelab.lab.measuring.Measurer.streams),
    # "computed" (steps) and "for_gone_clients" (steps that ended after their client had left).
    steps: dict[str, Any] | None = None
    resources: dict[str, Any] | None = None  # resource utilization time series sampled during the run
    # The load's own processes (the GPU check's closed loop, `make bench`'s load generator):
    # "processes", "cpu_percent" (each one's share of a core over the window), "saturated" (one was
    # near a full core: the client, not the server, may have set the pace); and, in the GPU check,
    # "connections_by_worker", each server process's own count of the load's connections, the most
    # seen while the load ran.
    client: dict[str, Any] | None = None
    # perf_analyzer: the command line that measured the run (on a retry, the attempt that counted).
    command: list[str] | None = None
    notes: list[str] = field(default_factory=list)
    # A service of the lab exited during the run (the local stack's supervisor said so): its
    # figures are not those of a clean run. Each entry says which, how and when.
    interrupted_by: list[str] = field(default_factory=list)
    started_at: str = field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds"))

    @property
    def images_per_s(self) -> float:
        return self.throughput_rps * self.batch_size

    def latency_ms(self, percentile: int) -> float:
        """The p50, p90, p95 or p99 latency, or NaN when the run is too short to know it."""
        value = getattr(self.latency, f"p{percentile}_ms")
        return value if percentile_known(percentile, self.requests) else math.nan

    def server_ms(self, stage: str) -> float:
        """One stage of Triton's server-side breakdown, in milliseconds per request: "queue",
        "compute_input", "compute_infer" or "compute_output" (perf_analyzer runs only)."""
        key = f"server_{stage}_us"
        if not self.server_breakdown or key not in self.server_breakdown:
            raise ValueError(f"{self.label} has no server-side {stage!r} time: only perf_analyzer runs report one")
        return self.server_breakdown[key] / 1000

    @property
    def error_count(self) -> int:
        return sum(self.errors.values())

    @property
    def clean(self) -> bool:
        """No service of the lab exited during the run."""
        return not self.interrupted_by

    @property
    def label(self) -> str:
        load = f"c={self.concurrency}" if self.mode == "closed" else f"{self.rate_rps:g} req/s {self.arrival}"
        batch = f", batch {self.batch_size}" if self.batch_size != 1 else ""
        return f"{self.name} [{self.tool}, {load}{batch}]"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunResult:
        """The record `to_dict` wrote; a run of sequences comes back as a `SequenceRunResult`."""
        if cls is RunResult and data.get("mode") == SEQUENCES:
            return SequenceRunResult.from_dict(data)
        known = {f.name for f in fields(cls)}
        values = {key: value for key, value in data.items() if key in known}
        if "target" in data and "name" not in data:  # saved before `name` was called `target` (issue 39)
            values["name"] = data["target"]
        for summary in ("latency", "patient_latency", "sequence_latency"):
            if values.get(summary) is not None:
                values[summary] = LatencySummary(**values[summary])
        return cls(**values)


@dataclass(frozen=True)
class StepCounts:
    """The steps of a streamed workload by the server's own account, cumulative since it started
    (service_stats.refine_steps, triton_stats.refine_steps): read before and after a run, their
    difference is what the server computed for it."""

    computed: int  # steps computed
    for_gone_clients: int  # steps that ended after their client had left: computed for nobody
    running: int  # streams being computed now


def _load_point(run: RunResult) -> tuple:
    """What windows of one load point share: the target, the tool, the mode and the load."""
    return (run.name, run.tool, run.mode, run.concurrency, run.batch_size)


def _added_errors(runs: list[RunResult]) -> dict[str, int]:
    added: Counter[str] = Counter()
    for run in runs:
        added.update(run.errors)  # a kind counted 0 is kept, as in each run
    return dict(added)


def at_once(parts: list[RunResult], notes: list[str], **fields: Any) -> RunResult:
    """Runs measured at the same time (the processes of one load point, or of one in-process plan) as
    one, named as the first: their requests and rates added up, their latencies and errors pooled,
    the longest wall time; with `notes`, and `fields` set beside them (the load's client)."""
    latencies = [value for part in parts for value in part.latencies_ms]
    first = parts[0]
    return RunResult(
        name=first.name,
        tool=first.tool,
        mode=first.mode,
        requests=sum(part.requests for part in parts),
        throughput_rps=sum(part.throughput_rps for part in parts),
        latency=LatencySummary.of(latencies),
        wall_s=max(part.wall_s for part in parts),
        concurrency=sum(part.concurrency or 1 for part in parts),
        errors=_added_errors(parts),
        latencies_ms=latencies,
        notes=notes,
        **fields,
    )


def pooled(windows: list[RunResult]) -> RunResult:
    """One closed-loop load point measured in several windows, as one result: the windows'
    requests and measured seconds added up (so its throughput is their total requests over their
    total seconds), their latencies and errors pooled, their timelines laid end to end. Triton's
    statistics and resource samples are the caller's: they depend on what ran between windows."""
    if not windows:
        raise ValueError("pooled() needs at least one window")
    first = windows[0]
    for window in windows:
        if _load_point(window) != _load_point(first) or window.mode != "closed" or window.impatient:
            raise ValueError(f"cannot pool {window.label} with {first.label}: pool one closed-loop load point")
    wall_s = sum(window.wall_s for window in windows)
    answered = sum(window.throughput_rps * window.wall_s for window in windows)
    latencies = [value for window in windows for value in window.latencies_ms]
    timeline, offset_s = [], 0.0
    for window in windows:
        timeline += [[offset_s + ended_s, *rest] for ended_s, *rest in window.timeline]
        offset_s += window.wall_s
    return RunResult(
        name=first.name,
        tool=first.tool,
        mode=first.mode,
        requests=sum(window.requests for window in windows),
        throughput_rps=answered / wall_s if wall_s > 0 else 0.0,
        latency=LatencySummary.of(latencies),
        wall_s=wall_s,
        concurrency=first.concurrency,
        batch_size=first.batch_size,
        errors=_added_errors(windows),
        cancelled=sum(window.cancelled for window in windows),
        latencies_ms=latencies,
        timeline=timeline,
        notes=[*first.notes, f"pooled from {len(windows)} measured windows"],
        interrupted_by=[text for window in windows for text in window.interrupted_by],
        started_at=first.started_at,
    )


SEQUENCES = "sequences"  # the mode of a SequenceRunResult


@dataclass
class SequenceRunResult(RunResult):
    """A run of sequences against a stateful model: `concurrency` sequences live at once, each of
    `sequence_length` frames, one request per frame. The inherited fields count frames:
    `requests` frames sent and ended, `throughput_rps` frames answered per second, `latency` and
    `latencies_ms` per frame. A sequence whose frame failed stops there (its state on the server
    is broken) and is counted in `sequences_failed` under the frame's error kind."""

    sequence_length: int = 0  # frames per sequence
    frame_interval_s: float | None = None  # None: each frame sent as soon as the previous one is answered
    sequences: int = 0  # measured sequences started
    sequences_completed: int = 0  # every frame answered
    sequences_failed: dict[str, int] = field(default_factory=dict)  # error kind of the frame that broke it -> count
    frames_skipped: int = 0  # came due while their sequence's previous frame was in flight: never sent
    sequence_latency: LatencySummary | None = None  # first frame sent -> last frame answered, completed sequences
    sequence_latencies_ms: list[float] = field(default_factory=list)

    @property
    def label(self) -> str:
        pace = f", a frame every {self.frame_interval_s * 1000:g} ms" if self.frame_interval_s else ""
        live = f"{self.concurrency} sequence{'' if self.concurrency == 1 else 's'}"
        return f"{self.name} [{self.tool}, {live} x {self.sequence_length} frames{pace}]"


def save_results(results: list[RunResult], path: Path, metadata: dict[str, Any] | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    document = {"metadata": metadata or {}, "results": [result.to_dict() for result in results]}
    path.write_text(json.dumps(document, indent=1, default=_json_default) + "\n")
    return path


def load_results(path: Path) -> tuple[list[RunResult], dict[str, Any]]:
    document = json.loads(Path(path).read_text())
    return [RunResult.from_dict(item) for item in document["results"]], document.get("metadata", {})


def append_result(path: Path, result: RunResult, metadata: dict[str, Any]) -> None:
    """Add one run, with what says where it comes from, as one line at the end of `path`: a run
    is on disk as soon as it ends, and a crash loses none before it (servelab.jsonl)."""
    jsonl.append(path, {"metadata": metadata, "result": result.to_dict()}, default=_json_default)


def load_appended(path: Path) -> list[tuple[RunResult, dict[str, Any]]]:
    """Every run `append_result` added to `path`, oldest first, each with its metadata."""
    return [(RunResult.from_dict(line["result"]), line["metadata"]) for line in jsonl.read(path)]


def saved_fields(result: RunResult) -> dict[str, str]:
    """Each field of `result` as the JSON text its saved record holds (`append_result`): a run
    loaded back gives the same texts as the run that was saved, although JSON turned its tuples
    into lists and its numeric keys into strings, and NaN, which equals nothing, is the text NaN."""
    return {name: json.dumps(value, default=_json_default) for name, value in result.to_dict().items()}


def _json_default(value: Any) -> Any:
    if isinstance(value, (np.floating, np.integer)):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"cannot save {type(value).__name__} as JSON")
