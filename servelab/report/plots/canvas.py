"""What every figure of servelab.report.plots shares: colours, the percentiles' styles, grouping runs
into series, the concurrency axis, and saving a figure as a PNG (`finish`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Iterable, Iterator
from itertools import cycle
from pathlib import Path
from typing import Any, TypeVar

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, NullLocator, ScalarFormatter
from matplotlib.typing import LineStyleType

from servelab.results import RunResult

PathLike = str | Path | None

PERCENTILE_STYLES: dict[str, LineStyleType] = {"p50": "-", "p95": "--", "p99": ":"}
PERCENTILE_MARKERS = {"p50": "o", "p95": "s", "p99": "^"}
DPI = 120


def color_cycle() -> Iterator[str]:
    """Matplotlib's colour cycle, repeating without end (so zip it with strict=False)."""
    return cycle(plt.rcParams["axes.prop_cycle"].by_key()["color"])


def finish(fig: Figure, path: PathLike) -> Figure:
    if path is not None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=DPI)
    return fig


Key = TypeVar("Key", bound=Hashable)


def grouped(results: Iterable[RunResult], key: Callable[[RunResult], Key]) -> dict[Key, list[RunResult]]:
    groups: dict[Key, list[RunResult]] = {}
    for result in results:
        groups.setdefault(key(result), []).append(result)
    return groups


def concurrency_of(result: RunResult) -> int:
    """A closed-loop result's concurrency (the plots of closed-loop runs keep only those that have one)."""
    assert result.concurrency is not None, f"{result.label} is not a closed-loop run"
    return result.concurrency


def rate_of(result: RunResult) -> float:
    """An open-loop result's offered rate (the plots of open-loop runs keep only those that have one)."""
    assert result.rate_rps is not None, f"{result.label} is not an open-loop run"
    return result.rate_rps


def series_name(name: str, tool: str, batch_size: int = 1) -> str:
    return f"{name} [{tool}]" + (f", batch {batch_size}" if batch_size != 1 else "")


def median(values: Iterable[float]) -> float:
    """The median of the finite values; NaN when there are none."""
    finite = [value for value in values if math.isfinite(value)]
    return float(np.median(finite)) if finite else math.nan


def concurrency_axis(ax: Any, values: Iterable[int]) -> None:
    """Log scale (base 2) when concurrency spans a wide range, with a tick at each measured value."""
    ticks = sorted(set(values))
    if ticks[0] > 0 and ticks[-1] / ticks[0] >= 8:
        ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlabel("concurrency (requests in flight)")
