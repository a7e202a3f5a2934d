"""The figures of what the server and the machine did over a run: Triton's executions by batch
size, the CPU of each process, and the machine's resources over time.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, TypeGuard, cast

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from servelab.report.plots.canvas import (
    PathLike,
    color_cycle,
    finish,
)
from servelab.results import RunResult
from servelab.service.cores import available_cores
from servelab.triton.stats import StatsDelta

# What plot_batch_sizes accepts as one set of batch statistics.
BatchStats = StatsDelta | Mapping[str, Any] | Mapping[int, int]


def _histogram(stats: BatchStats) -> tuple[str | None, dict[int, int], float | None]:
    """(model name, executions by batch size, average batch size) of one set of batch statistics."""
    # Either form: {"executions_by_batch_size": {...}, ...} or {batch size: count}.
    data: Mapping[Any, Any] = stats.to_dict() if isinstance(stats, StatsDelta) else stats
    if "executions_by_batch_size" in data:
        # JSON turns the integer batch sizes into strings: accept both.
        counts = {int(size): int(count) for size, count in data["executions_by_batch_size"].items()}
        return data.get("model"), counts, data.get("avg_batch_size")
    return None, {int(size): int(count) for size, count in data.items()}, None


def _is_one_set(stats: Any) -> TypeGuard[BatchStats]:
    """A StatsDelta, its dict, or a {batch size: count} mapping, rather than a {label: stats} mapping."""
    if isinstance(stats, StatsDelta):
        return True
    if not isinstance(stats, Mapping):
        return False
    labelled = all(isinstance(value, (StatsDelta, Mapping)) for value in stats.values())
    return "executions_by_batch_size" in stats or not labelled


def plot_batch_sizes(
    stats: BatchStats | Sequence[BatchStats] | Mapping[str, BatchStats],
    labels: Sequence[str] | None = None,
    path: PathLike = None,
    title: str = "Executions per batch size",
    share: bool = False,
) -> Figure:
    """Bar chart: how many model executions ran at each batch size.

    `stats`: a `StatsDelta`, its `to_dict()` (e.g. a RunResult's `triton_stats`), or a plain
    {batch size: executions} mapping; or several of these, as a list (with `labels`) or as a
    {label: stats} mapping, to compare e.g. before/after enabling dynamic batching.
    `share`: draw each batch size's share of the run's inferences (in %) instead of the count of
    executions, so that runs of different lengths compare; the legend gives each run's totals.
    """
    if _is_one_set(stats):
        items: list[BatchStats] = [stats]
    elif isinstance(stats, Mapping):  # not one set (above): {label: stats}
        labelled = cast(Mapping[str, BatchStats], stats)
        labels = labels or list(labelled)
        items = list(labelled.values())
    else:  # neither one set nor a mapping: a list of sets
        items = list(cast(Sequence[BatchStats], stats))
    histograms = [_histogram(item) for item in items]
    if not any(counts for _, counts, _ in histograms):
        raise ValueError("nothing to plot: no executions recorded")
    if labels is None:
        models = [model for model, _, _ in histograms if model is not None]
        unique = len(models) == len(histograms) and len(set(models)) == len(models)
        labels = models if unique else [f"run {i + 1}" for i in range(len(histograms))]
    if len(labels) != len(histograms):
        raise ValueError(f"{len(labels)} labels for {len(histograms)} sets of statistics")

    sizes = sorted({size for _, counts, _ in histograms for size in counts})
    positions = np.arange(len(sizes))
    width = 0.8 / len(histograms)
    fig, ax = plt.subplots(figsize=(max(7.0, 0.55 * len(sizes) * len(histograms) + 3), 4.8), layout="constrained")
    for i, (color, label, (_, counts, avg_batch)) in enumerate(zip(color_cycle(), labels, histograms, strict=False)):
        offset = (i - (len(histograms) - 1) / 2) * width
        inferences = sum(size * count for size, count in counts.items())
        if share:
            label = f"{label} ({inferences} inferences in {sum(counts.values())} executions)"
            heights = [100 * size * counts.get(size, 0) / inferences for size in sizes]
            texts = [f"{height:.0f}%" if height else "" for height in heights]
        else:
            heights = [counts.get(size, 0) for size in sizes]
            texts = [str(counts[size]) if counts.get(size) else "" for size in sizes]
        if avg_batch is not None and not math.isnan(avg_batch):
            label = f"{label}, avg batch {avg_batch:.2f}"
        bars = ax.bar(positions + offset, heights, width, color=color, label=label)
        ax.bar_label(bars, labels=texts, fontsize="small")
    ax.set_xticks(positions, [str(size) for size in sizes])
    ax.set_xlabel("batch size executed (inferences per model execution)")
    ax.set_ylabel("% of the run's inferences" if share else "executions")
    ax.margins(y=0.12)  # room for the count above the tallest bar
    ax.grid(True, axis="y", alpha=0.3)
    ax.set_axisbelow(True)
    ax.legend(fontsize="small")
    ax.set_title(title)
    return finish(fig, path)


def plot_process_cpu(
    runs: Mapping[str, RunResult | None], cores: int | None = None, path: PathLike = None, title: str = ""
) -> Figure | None:
    """Stacked bars: each run's CPU per process (`resources["processes"]`, % of one core, as
    TritonSide.perf records it for a model's instances), against the line of every core busy
    (`cores`: this machine's where left out). Where no run has a process's CPU, nothing is drawn:
    it says why, and returns None."""
    if not any((result.resources or {}).get("processes") for result in runs.values() if result is not None):
        print(
            "No CPU per process to plot: a model's instance processes are seen only by a notebook on the machine "
            "that runs them (in Docker they run in Triton's container), and only a Python-backend model's "
            "instances are processes."
        )
        return None
    cores = cores or available_cores()
    fig, ax = plt.subplots(figsize=(max(6.0, 1.6 * len(runs) + 2), 4.5), layout="constrained")
    for position, result in enumerate(runs.values()):
        bottom = 0.0
        processes = (result.resources or {}).get("processes", {}) if result else {}
        for color, (process, percent) in zip(color_cycle(), processes.items(), strict=False):
            ax.bar(position, percent, bottom=bottom, color=color, edgecolor="white", width=0.6)
            if percent >= 8:
                ax.text(position, bottom + percent / 2, process, ha="center", va="center", fontsize="x-small")
            bottom += percent
        ax.text(position, bottom, f"{bottom:.0f}%", ha="center", va="bottom", fontsize="small")
    ax.axhline(100 * cores, color="tab:red", linestyle="--", label=f"all {cores} cores busy ({100 * cores}%)")
    ax.set_xticks(range(len(runs)), list(runs))
    ax.set_ylabel("CPU per process (% of one core, stacked)")
    ax.set_ylim(0, 100 * cores * 1.2)
    ax.grid(True, axis="y", alpha=0.3)
    ax.set_axisbelow(True)
    ax.legend(loc="upper left", fontsize="small")
    ax.set_title(title or "CPU used by each instance process")
    return finish(fig, path)


def plot_resources(series: Mapping[str, Any], path: PathLike = None, title: str = "Resource utilization") -> Figure:
    """CPU (total and per core), memory, and each GPU's utilization and memory over time.

    `series`: `ResourceSampler.series()`, e.g. a RunResult's `resources`.
    """
    t = series["t_s"]
    if not t:
        raise ValueError("the resource series has no samples (was the run shorter than one interval?)")
    gpus = series["gpus"]
    rows = 3 if gpus else 1
    fig, axes = plt.subplots(rows, 1, figsize=(11, 3.3 * rows + 0.6), sharex=True, layout="constrained", squeeze=False)
    ax_cpu = axes[0][0]

    per_core = np.asarray(series["cpu_per_core"], dtype=float)  # samples x cores
    for core in range(per_core.shape[1]):
        ax_cpu.plot(
            t, per_core[:, core], color="tab:blue", linewidth=0.7, alpha=0.35, label="each core" if core == 0 else None
        )
    ax_cpu.plot(t, series["cpu_percent"], color="tab:blue", linewidth=2.2, label="all cores")
    if "process_cpu_percent" in series:
        # Per-process CPU is in % of one core; divided by the core count it is on the same scale.
        share = np.asarray(series["process_cpu_percent"], dtype=float) / series["cpu_count"]
        ax_cpu.plot(t, share, color="tab:orange", linewidth=1.8, label="watched processes (% of all cores)")
    ax_cpu.plot(t, series["memory_percent"], color="tab:gray", linestyle="--", linewidth=1.5, label="memory used")
    ax_cpu.set_ylim(0, 105)
    ax_cpu.set_ylabel("% of machine")
    cpu_title = f"CPU ({series.get('cpu_count', per_core.shape[1])} cores) and memory"
    ax_cpu.set_title(cpu_title if gpus else f"{cpu_title}; GPU: {series['gpu_source']}")
    ax_cpu.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small")

    if gpus:
        ax_util, ax_memory = axes[1][0], axes[2][0]
        for color, gpu in zip(color_cycle(), gpus, strict=False):
            name = f"GPU {gpu['index']}: {gpu['name']}"
            ax_util.plot(t, gpu["util_percent"], color=color, linewidth=1.8, label=name)
            ax_memory.plot(t, gpu["memory_used_mib"], color=color, linewidth=1.8, label=f"{name}, used")
            ax_memory.axhline(
                gpu["memory_total_mib"],
                color=color,
                linestyle=":",
                linewidth=1.2,
                label=f"{name}, total ({gpu['memory_total_mib']:.0f} MiB)",
            )
        ax_util.set_ylim(0, 105)
        ax_util.set_ylabel("GPU utilization (%)")
        ax_util.set_title(f"GPU utilization (read with {series['gpu_source']})")
        ax_memory.set_ylim(bottom=0)
        ax_memory.set_ylabel("GPU memory (MiB)")
        ax_memory.set_title("GPU memory")
        for ax in (ax_util, ax_memory):
            ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small")
    for row in axes:
        row[0].grid(True, alpha=0.3)
    axes[-1][0].set_xlabel("time since the start of sampling (s)")
    fig.suptitle(title)
    return finish(fig, path)
