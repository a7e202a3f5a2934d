"""A step of the node's build that prints nothing, told apart from one that stopped by the bytes
the node receives meanwhile (servelab.node_build's runner watches every step with it).

pip prints nothing while it downloads a package, and PyTorch's CUDA 12.6 wheel is 3.6 GB: at the
node's planned rate (servelab.node_plan) that is minutes of silence in the build's log, more where a
mirror is slow. The Jupyter container calls a build whose log has said nothing for
node_build.SILENT_LIMIT_S stopped; so where the log stays quiet for QUIET_S while the node receives
at least RECEIVING_BYTES, the runner writes a line to the log saying so, and the log's age measures
a build that stopped, not one that downloads.

Standard library only, like servelab.node_build, which the node runs with its system Python.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

QUIET_S = 60.0  # a log quiet this long gets a line, where the node received enough meanwhile
# Per QUIET_S: 10 MB a minute, a download at the slowest; an idle node (SSH polls, the Jupyter
# server) receives kilobytes.
RECEIVING_BYTES = 10_000_000


def bytes_received(net_dev: Path = Path("/proc/net/dev")) -> int:
    """The bytes the machine's network interfaces but loopback have received since boot (0 where that
    cannot be read). A download may count twice (the physical interface and Docker's bridge): only its
    growth is used."""
    try:
        rows = [line.split(":", 1) for line in net_dev.read_text().splitlines() if ":" in line]
    except OSError:
        return 0
    return sum(int(counts.split()[0]) for name, counts in rows if name.strip() != "lo")


def exit_code_within(process: subprocess.Popen) -> Callable[[float], int | None]:
    """`process`'s exit code once it has ended within the seconds given, else None."""

    def wait(timeout_s: float) -> int | None:
        try:
            return process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return None

    return wait


def watch(
    wait: Callable[[float], int | None],
    log: BinaryIO,
    poll_s: float,
    clock: Callable[[], float],
    received: Callable[[], int] = bytes_received,
) -> int:
    """Wait for a step (`wait(seconds)`: its exit code, None while it runs) that writes to `log`; each
    time the log has been quiet for QUIET_S while the node received RECEIVING_BYTES or more, a line in
    the log says how much. A quiet log without traffic gets no line: that step has stopped."""
    size, quiet_since, count = os.fstat(log.fileno()).st_size, clock(), received()
    while (code := wait(poll_s)) is None:
        now = clock()
        if (grown := os.fstat(log.fileno()).st_size) != size:  # the step printed
            size, quiet_since, count = grown, now, received()
        elif now - quiet_since >= QUIET_S:
            if (moved := received() - count) >= RECEIVING_BYTES:
                log.write(
                    f"---- servelab: the step printed nothing for {now - quiet_since:.0f} s, and the node "
                    f"received {moved / 1e6:.0f} MB meanwhile: a download (pip says nothing until it is in)\n".encode()
                )
            size, quiet_since, count = os.fstat(log.fileno()).st_size, now, received()
    return code
