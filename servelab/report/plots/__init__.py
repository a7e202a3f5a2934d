"""The lab's figures, drawn from `RunResult`s whichever tool measured them.

Every plot function returns its matplotlib Figure and, given `path`, also saves it as a PNG (one
with nothing to draw, `plot_process_cpu` without a process's CPU, says why and returns None). In
Jupyter a figure shows inline by itself; end the line with `;` so that the returned Figure is
not shown a second time. In a script, `plt.close(fig)` a figure once it is saved.

The figures by what they show:
- `latency`: what the clients measured: latency and throughput against concurrency, the latency's
  distribution, throughput against its bounds, and latency against queueing theory's prediction;
- `machine`: what the server and the machine did: executions by batch size, CPU per process,
  resources over time;
- `canvas`: what every figure shares: colours, styles, the concurrency axis, saving.
"""

import os
import sys

import matplotlib

# Without a display (a server, CI, the GPU node over SSH) draw into files only. A backend chosen
# through MPLBACKEND is left alone: that is how Jupyter selects its inline backend.
# Chosen here, before this package's modules import pyplot: a package's __init__ runs first.
if (
    sys.platform.startswith("linux")
    and not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))
    and "MPLBACKEND" not in os.environ
    and "ipykernel" not in sys.modules
):
    matplotlib.use("Agg")


from servelab.report.plots.latency import (  # noqa: E402  (after the backend choice)
    plot_latency_cdf,
    plot_latency_throughput_vs_concurrency,
    plot_queueing,
    plot_throughput_bounds,
)
from servelab.report.plots.machine import plot_batch_sizes, plot_process_cpu, plot_resources  # noqa: E402

__all__ = [
    "plot_batch_sizes",
    "plot_latency_cdf",
    "plot_latency_throughput_vs_concurrency",
    "plot_process_cpu",
    "plot_queueing",
    "plot_resources",
    "plot_throughput_bounds",
]
