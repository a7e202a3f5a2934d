"""One closed-loop point in client processes of their own: `run_closed` on a prepared POST
(`HttpTarget`) in each, split over as many processes as the point needs, all beginning at one
moment; their figures added up; how busy each client was; and how the load's connections spread
over the server's processes, read from each one's own sockets while the load runs (the reading
that saw the most of them). The GPU check and notebook 6's claims on a GPU load with it.

    python -m servelab.loadgen.processes --url URL --body FILE [--header "Name: value"] --name NAME \
        --concurrency 16 --seconds 10 --warmup 2 [--start-file PATH]

runs one client: it prints RESULT_MARK and its RunResult as JSON, with its own CPU time over the
window as a share of one core (`client["cpu_percent"]`).

Why processes: one asyncio loop of Python sends and reads every request of its share; near a full
core it, not the server, sets the pace. A point where a client was that busy is marked saturated,
and no goal is judged on it. A client never takes the interpreter of the server or of its caller.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psutil

from servelab import paths
from servelab.loadgen.load import Load
from servelab.loadgen.runners import run_closed
from servelab.loadgen.targets import HttpTarget
from servelab.results import RunResult, at_once

log = logging.getLogger(__name__)

RESULT_MARK = "client result: "
REQUEST_TIMEOUT_S = 60.0
SENDERS_PER_CLIENT = 8  # one client process for every 8 senders...
CLIENT_SHARE_OF_CORES = 4  # ...and at most a quarter of the cores: the service needs the rest
SATURATED_PERCENT = 90.0  # a client at 90% of a core or more may have set the pace itself
READY_MARK = "client ready"
# The clients begin together once all have started: a fixed delay is outlasted by a client's start
# (its interpreter and imports) on a busy machine, and clients that do not overlap load nothing
# together. Each checks for the start file every START_POLL_S; the moment is set START_MARGIN_S
# ahead, for every client to have seen it.
START_POLL_S = 0.01
START_MARGIN_S = 0.5
CLIENTS_START_TIMEOUT_S = 120.0
SPREAD_EVERY_S = 0.25  # how often the connections' spread is read while the clients run


def client_processes(concurrency: int, cores: int) -> int:
    """How many client processes carry `concurrency` senders on a machine of `cores` cores."""
    wanted = math.ceil(concurrency / SENDERS_PER_CLIENT)
    return max(1, min(wanted, concurrency, cores // CLIENT_SHARE_OF_CORES))


def shares(concurrency: int, processes: int) -> list[int]:
    """`concurrency` senders over `processes` clients, as evenly as they go (the first get one more)."""
    base, extra = divmod(concurrency, processes)
    return [base + (index < extra) for index in range(processes)]


def connections_by_worker(pids: Sequence[int], port: int) -> dict[str, int]:
    """Each of `pids`' own count of established connections on `port` (its accepted clients). Left
    out: a process with no socket on that port (Triton's stubs), and the first of `pids`, the
    service's leader, where it accepts none and others hold sockets on the port (a supervisor)."""
    counts = {}
    for pid in pids:
        try:
            process = psutil.Process(pid)
            sockets = process.net_connections(kind="tcp")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        mine = [conn for conn in sockets if conn.laddr and conn.laddr.port == port]
        if mine:
            counts[str(pid)] = sum(conn.status == psutil.CONN_ESTABLISHED for conn in mine)
    if len(counts) > 1 and counts.get(leader := str(pids[0])) == 0:
        del counts[leader]
    return counts


def client_record(cpu_percent: list[float]) -> dict[str, Any]:
    """`RunResult.client` for a load from client processes that each used `cpu_percent` of a core
    over the window: saturated where one reached SATURATED_PERCENT (the GPU check's load and
    `make bench`'s are judged alike)."""
    return {
        "processes": len(cpu_percent),
        "cpu_percent": cpu_percent,
        "saturated": any(percent >= SATURATED_PERCENT for percent in cpu_percent),
    }


def combined(name: str, parts: list[RunResult], connections: dict[str, int]) -> RunResult:
    """The clients' runs as one (results.at_once), named `name`, with their CPU and the connections' spread."""
    cpu = [percent for part in parts for percent in (part.client or {}).get("cpu_percent", [])]
    notes = [*parts[0].notes, f"{len(parts)} client process(es), {', '.join(f'{c:.0f}%' for c in cpu)} of a core"]
    run = at_once(parts, notes, client={**client_record(cpu), "connections_by_worker": connections})
    run.name = name
    return run


async def one_client(
    name: str, url: str, body: bytes, headers: dict[str, str], concurrency: int, seconds: float, warmup_s: float
) -> RunResult:
    """`concurrency` senders posting `body` to `url` (servelab.loadgen.runners.run_closed): a warm-up
    of `warmup_s` not counted, then `seconds` measured, with this process's CPU over the window."""
    measuring: list[float] = []  # the CPU and wall clocks as measurement starts
    target = HttpTarget(name, url, body, headers, REQUEST_TIMEOUT_S)
    load = Load(concurrency, duration_s=seconds, warmup_s=warmup_s)
    on_measuring = lambda: measuring.extend((time.process_time(), time.perf_counter()))  # noqa: E731
    result = await run_closed(target, load, progress=False, on_measuring=on_measuring)
    cpu_percent = 100 * (time.process_time() - measuring[0]) / (time.perf_counter() - measuring[1])
    result.timeline = []  # every request's outcome: the latencies say what the check reads, in less room
    result.notes.append(f"{warmup_s:g} s warm-up at the same concurrency, not counted; {len(body)} bytes a request")
    result.client = {"processes": 1, "cpu_percent": [round(cpu_percent, 1)]}
    return result


def load_point(
    url: str,
    body: bytes,
    headers: dict[str, str],
    name: str,
    concurrency: int,
    seconds: float,
    warmup_s: float,
    server_pids: Sequence[int],
    port: int,
    cores: int,
) -> RunResult:
    """One closed-loop point against `url`, from client processes of their own that begin together,
    once all have started. The connections' spread is read every SPREAD_EVERY_S while the clients
    run, and the reading that saw the most is kept."""
    count = client_processes(concurrency, cores)
    with tempfile.TemporaryDirectory(prefix="loadgen-clients-") as folder:
        body_file, start_file = Path(folder) / "body", Path(folder) / "start"
        body_file.write_bytes(body)
        clients = []
        for index, senders in enumerate(shares(concurrency, count)):
            command = [sys.executable, "-m", __name__, "--url", url, "--body", str(body_file)]
            command += [arg for key, value in headers.items() for arg in ("--header", f"{key}: {value}")]
            command += ["--name", name, "--concurrency", str(senders), "--seconds", f"{seconds:g}"]
            command += ["--warmup", f"{warmup_s:g}", "--start-file", str(start_file)]
            # Files, not pipes: a client's result (every latency) may exceed a pipe's buffer while it is not read.
            with (
                (Path(folder) / f"client-{index}.out").open("wb") as out,
                (Path(folder) / f"client-{index}.err").open("wb") as err,
            ):
                clients.append(subprocess.Popen(command, cwd=paths.REPO_ROOT, stdout=out, stderr=err))
        started(clients, [Path(folder) / f"client-{index}.out" for index in range(count)], start_file)
        deadline = time.monotonic() + warmup_s + seconds + 180
        connections: dict[str, int] = {}
        while any(client.poll() is None for client in clients):
            if time.monotonic() > deadline:
                for client in clients:
                    client.kill()
                raise subprocess.TimeoutExpired(command, deadline)
            reading = connections_by_worker(server_pids, port)
            if sum(reading.values()) > sum(connections.values()):
                connections = reading
            time.sleep(SPREAD_EVERY_S)
        parts = []
        for index, client in enumerate(clients):
            out_text = (Path(folder) / f"client-{index}.out").read_text(errors="replace")
            said = (Path(folder) / f"client-{index}.err").read_text(errors="replace")
            marked = [line for line in out_text.splitlines() if line.startswith(RESULT_MARK)]
            if not marked:
                log.error("the load generator against %s failed:\n%s", name, said[-2000:])
                raise RuntimeError(f"the load generator failed (exit code {client.returncode}): {last_line(said)}")
            parts.append(RunResult.from_dict(json.loads(marked[0].removeprefix(RESULT_MARK))))
    return combined(name, parts, connections)


def started(clients: list[subprocess.Popen], outputs: list[Path], start_file: Path) -> None:
    """Once every client has said it is ready (in its output file), or one has ended (its error is
    read with its result), write the moment they begin into `start_file`, atomically."""
    deadline = time.monotonic() + CLIENTS_START_TIMEOUT_S
    while not all(
        client.poll() is not None or READY_MARK in out.read_text(errors="replace")
        for client, out in zip(clients, outputs, strict=True)
    ):
        if time.monotonic() > deadline:
            for client in clients:
                client.kill()
            raise subprocess.TimeoutExpired(clients[0].args, CLIENTS_START_TIMEOUT_S)
        time.sleep(START_POLL_S)
    written = start_file.with_suffix(".part")
    written.write_text(f"{time.time() + START_MARGIN_S:.3f}")
    written.replace(start_file)


def last_line(text: str) -> str:
    """The last line said, for a table's cell (the whole text goes to the log)."""
    return next((line.strip() for line in reversed(text.splitlines()) if line.strip()), "nothing said")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {__name__}", description="One client of a load point.")
    parser.add_argument("--url", required=True)
    parser.add_argument("--body", type=Path, required=True, help="file holding the request's body")
    parser.add_argument("--header", action="append", default=[], help='"Name: value", repeatable')
    parser.add_argument("--name", required=True, help="what the run measures, as its RunResult names it")
    parser.add_argument("--concurrency", type=int, required=True)
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--warmup", type=float, default=0.0)
    parser.add_argument(
        "--start-file",
        type=Path,
        help="say ready, then begin at the moment (epoch seconds) written there (default: now)",
    )
    args = parser.parse_args(argv)
    headers = dict(header.split(": ", 1) for header in args.header)
    if args.start_file is not None:  # several clients of one load point begin together
        print(READY_MARK, flush=True)
        while not args.start_file.exists():
            time.sleep(START_POLL_S)
        time.sleep(max(0.0, float(args.start_file.read_text()) - time.time()))
    result = asyncio.run(
        one_client(args.name, args.url, args.body.read_bytes(), headers, args.concurrency, args.seconds, args.warmup)
    )
    print(RESULT_MARK + json.dumps(result.to_dict()), flush=True)
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    sys.exit(main())
