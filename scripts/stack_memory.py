"""The memory `make up`'s stack takes: idle, and under notebook 4's load on the PyTorch service.

    make up                                    # in one terminal; wait for "The lab is up:"
    .venv/bin/python scripts/stack_memory.py   # in another: about 2 minutes

It finds the `servelab up` process (the supervisor that `make up` runs) and sums the memory of it
and every process under it (the services, Triton's model stubs, Ray's processes, JupyterLab's
kernels): PSS, each shared page counted once over the processes that share it (Linux's
/proc/PID/smaps_rollup), and RSS, each process counted whole. It samples the stack idle, then
while the load generator's closed loop runs against fastapi_pt at each concurrency of notebook 4
(16 and 64 clients; the load generator's own process, not part of the stack, is left out), and
prints the largest sum seen under each load.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

import psutil

from servelab.stack.supervision import Ports

MB = 1024 * 1024


def supervisor() -> psutil.Process:
    for process in psutil.process_iter(["cmdline"]):
        if process.info["cmdline"] and process.info["cmdline"][-2:] == ["servelab", "up"]:
            return process
    sys.exit("No `servelab up` process here: start the lab with `make up` first.")


def stack_memory(root: psutil.Process) -> tuple[float, float, int]:
    """(PSS, RSS) in MB summed over `root` and every process under it, and how many processes."""
    pss = rss = 0
    processes = [root, *root.children(recursive=True)]
    for process in processes:
        try:
            info = process.memory_full_info()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue  # a process that ended between the listing and the reading
        pss, rss = pss + info.pss, rss + info.rss
    return pss / MB, rss / MB, len(processes)


def sampled(root: psutil.Process, seconds: float, every_s: float = 1.0) -> list[tuple[float, float, int]]:
    samples, end = [], time.monotonic() + seconds
    while time.monotonic() < end:
        samples.append(stack_memory(root))
        time.sleep(every_s)
    return samples


def under_load(root: psutil.Process, address: str, clients: int, seconds: float) -> list[tuple[float, float, int]]:
    """Samples while the load generator (a process of its own) keeps `clients` requests in flight."""
    arguments = f"--target fastapi --address {address} --concurrency {clients} --warmup-s 5 --duration {seconds}"
    command = [sys.executable, "-m", "servelab", "loadgen", *arguments.split()]
    load = subprocess.Popen(command, stdout=subprocess.DEVNULL)
    samples = []
    while load.poll() is None:
        samples.append(stack_memory(root))
        time.sleep(0.5)
    if load.returncode != 0:
        sys.exit(f"the load generator failed (exit {load.returncode}): {' '.join(command)}")
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--idle-s", type=float, default=30.0, help="seconds of idle samples")
    parser.add_argument("--load-s", type=float, default=30.0, help="seconds of measured load at each concurrency")
    parser.add_argument("--clients", type=int, nargs="+", default=[16, 64], help="closed-loop concurrencies")
    args = parser.parse_args()
    root = supervisor()
    address = f"http://127.0.0.1:{Ports.configured().fastapi_pt}"
    idle = sampled(root, args.idle_s)
    pss, rss, count = (statistics.median(column) for column in zip(*idle, strict=True))
    print(f"idle: PSS {pss:,.0f} MB, RSS {rss:,.0f} MB over {count:.0f} processes (median of {len(idle)} samples)")
    for clients in args.clients:
        loaded = under_load(root, address, clients, args.load_s)
        pss, rss, count = (max(column) for column in zip(*loaded, strict=True))
        print(f"{clients} clients on fastapi_pt: PSS {pss:,.0f} MB, RSS {rss:,.0f} MB at most, {count} processes")


if __name__ == "__main__":
    main()
