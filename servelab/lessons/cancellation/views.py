"""What notebook 10 and its appendix show: the streams' table and the race probe's, and notebook 10's
two plots (the streams by engine, the request runs' goodput beside their waste).
"""

from __future__ import annotations

import math

from servelab.lessons.cancellation.race_checks import RaceProbe
from servelab.results import RunResult


def stream_rows(streams: dict[tuple[str, str], RunResult]) -> list[str]:
    """The streams' table, a line each: per engine and setting, the streams whose client left,
    the steps computed and those for clients who left (in all, and per client who left), and the
    patient clients' p50 / p95 to their last step."""
    rows = [
        f"{'engine':>9} | {'cancellation':>12} | {'streams left':>12} | {'steps computed':>14} | "
        f"{'for clients who left':>20} | {'per client who left':>19} | patient p50 / p95 to the last step"
    ]
    engines = dict.fromkeys(engine for engine, _ in streams)
    for engine, setting in [(engine, setting) for engine in engines for setting in ("off", "on")]:
        if (run := streams.get((engine, setting))) is None:
            continue
        steps = run.steps or {}
        per_client = steps["for_gone_clients"] / run.cancelled if run.cancelled else math.nan
        patient = run.patient_latency
        p50, p95 = (patient.p50_ms, patient.p95_ms) if patient else (math.nan, math.nan)
        rows.append(
            f"{engine:>9} | {setting:>12} | {run.cancelled:>12} | {steps['computed']:>14} | "
            f"{steps['for_gone_clients']:>20} | {per_client:>19.2f} | "
            f"{p50:.0f} / {p95:.0f} ms ({len(run.latencies_ms)} streams)"
        )
    return rows


def probe_rows(probes: dict[str, RaceProbe]) -> list[str]:
    """The race probe's table, a line per deadline: cancellations, the steps at which the server
    handled them, the share handled as the answer completed, and the crash."""
    rows = [
        f"{'deadline':>22} | {'cancelled':>9} | {'handled at each step':<40} | {'as the answer completed':>23} | crash"
    ]
    for deadline, probe in probes.items():
        steps = ", ".join(f"{step} {count}" for step, count in sorted(probe.steps.items())) or "no log to read"
        rows.append(
            f"{deadline:>22} | {probe.cancelled:>9} | {steps:<40} | {100 * probe.near_share:>22.1f}% |"
            f" {probe.crash or 'none'}"
        )
    return rows


def plot_streams(streams: dict[tuple[str, str], RunResult], title: str) -> None:
    """Steps computed for clients who left and the patient clients' p50, by engine, cancellation
    off and on."""
    import matplotlib.pyplot as plt

    engines = list(dict.fromkeys(engine for engine, _ in streams))
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 3.5))
    width = 0.38
    for offset, setting, color in ((-width / 2, "off", "tab:red"), (width / 2, "on", "tab:green")):
        at = [index + offset for index in range(len(engines))]
        runs = [streams[engine, setting] for engine in engines]
        left.bar(at, [(run.steps or {})["for_gone_clients"] for run in runs], width, color=color, label=setting)
        right.bar(
            at, [getattr(run.patient_latency, "p50_ms", math.nan) for run in runs], width, color=color, label=setting
        )
    for axis, title_of_axis in (
        (left, "steps computed for clients who left"),
        (right, "patient p50 to the last step (ms)"),
    ):
        axis.set_xticks(range(len(engines)), engines)
        axis.set_title(title_of_axis)
        axis.legend(title="cancellation")
    fig.suptitle(title)
    fig.tight_layout()
    plt.show()


def plot_goodput_and_waste(runs: dict[str, RunResult], wasted: dict[str, float], title: str) -> None:
    """Each request run's goodput and its wasted inferences per second, side by side."""
    import matplotlib.pyplot as plt

    names = list(runs)
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4), sharey=True)
    left.barh(names, [runs[name].throughput_rps for name in names], color="tab:green")
    left.set_xlabel("goodput (answers to clients still waiting, req/s)")
    right.barh(names, [wasted[name] / runs[name].wall_s for name in names], color="tab:red")
    right.set_xlabel("wasted inferences per second (computed for nobody)")
    left.invert_yaxis()
    fig.suptitle(title)
    fig.tight_layout()
    plt.show()
