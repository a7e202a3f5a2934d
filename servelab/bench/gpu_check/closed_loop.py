"""A closed loop of one prepared POST, in a process of its own: the GPU check's load (servelab.bench.gpu_check).

    python -m servelab.bench.gpu_check.closed_loop --url URL --body FILE [--header "Name: value"] --name NAME \
        --concurrency 16 --seconds 10 --warmup 2 [--start-at EPOCH]

`concurrency` senders, each posting the same body again as soon as its answer is in: first for the
warm-up, then for the measured window; requests sent before a phase's end are waited for and counted,
as in the lab's load generator (servelab.loadgen.runners). It prints one line, RESULT_MARK and the
run's RunResult as JSON, with the process's own CPU time over the window as a share of one core
(`client["cpu_percent"]`): one asyncio loop near a full core sets the pace itself. Several such
processes share one load point (servelab.bench.gpu_check.load), each starting at `--start-at`.

Why not servelab.loadgen: importing it imports tritonclient (its package and its targets do, at
import), which a bare GPU machine lacks; aiohttp is there. Run in a process of its own, the client
never takes the server's interpreter or the GIL of the process that started it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections import Counter
from pathlib import Path

import aiohttp

from servelab.results import LatencySummary, RunResult

RESULT_MARK = "closed-loop result: "
TOOL = "aiohttp closed loop"
REQUEST_TIMEOUT_S = 60.0


async def _phase(
    session: aiohttp.ClientSession, url: str, body: bytes, headers: dict[str, str], concurrency: int, seconds: float
) -> tuple[list[float], Counter[str], float]:
    """(latencies of the answered requests in ms, failures by kind, wall time) of one phase."""
    latencies_ms: list[float] = []
    errors: Counter[str] = Counter()
    started = time.perf_counter()
    deadline = started + seconds

    async def sender() -> None:
        while time.perf_counter() < deadline:
            sent = time.perf_counter()
            try:
                async with session.post(url, data=body, headers=headers) as response:
                    await response.read()
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                errors[type(exc).__name__] += 1
                continue
            if response.status == 200:
                latencies_ms.append((time.perf_counter() - sent) * 1000)
            else:
                errors[f"http_{response.status}"] += 1

    await asyncio.gather(*(sender() for _ in range(concurrency)))
    return latencies_ms, errors, time.perf_counter() - started


async def closed_loop(
    name: str, url: str, body: bytes, headers: dict[str, str], concurrency: int, seconds: float, warmup_s: float
) -> RunResult:
    """`concurrency` senders posting `body` to `url`: warmup_s seconds not counted, then `seconds` measured."""
    connector = aiohttp.TCPConnector(limit=concurrency)
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        if warmup_s > 0:
            await _phase(session, url, body, headers, concurrency, warmup_s)
        cpu_started = time.process_time()
        latencies_ms, errors, wall_s = await _phase(session, url, body, headers, concurrency, seconds)
        cpu_percent = 100 * (time.process_time() - cpu_started) / wall_s
    return RunResult(
        name=name,
        tool=TOOL,
        mode="closed",
        requests=len(latencies_ms) + sum(errors.values()),
        throughput_rps=len(latencies_ms) / wall_s,
        latency=LatencySummary.of(latencies_ms),
        wall_s=wall_s,
        concurrency=concurrency,
        errors=dict(errors),
        latencies_ms=latencies_ms,
        notes=[f"{warmup_s:g} s warm-up at the same concurrency, not counted; {len(body)} bytes a request"],
        client={"processes": 1, "cpu_percent": [round(cpu_percent, 1)]},
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m servelab.bench.gpu_check.closed_loop", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--url", required=True)
    parser.add_argument("--body", type=Path, required=True, help="file holding the request's body")
    parser.add_argument("--header", action="append", default=[], help='"Name: value", repeatable')
    parser.add_argument("--name", required=True, help="what the run measures, as its RunResult names it")
    parser.add_argument("--concurrency", type=int, required=True)
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--warmup", type=float, default=0.0)
    parser.add_argument("--start-at", type=float, help="when to begin, in seconds since the epoch (default: now)")
    args = parser.parse_args(argv)
    headers = dict(header.split(": ", 1) for header in args.header)
    if args.start_at is not None:  # several clients of one load point begin together
        time.sleep(max(0.0, args.start_at - time.time()))
    result = asyncio.run(
        closed_loop(args.name, args.url, args.body.read_bytes(), headers, args.concurrency, args.seconds, args.warmup)
    )
    print(RESULT_MARK + json.dumps(result.to_dict()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
