"""A perf_analyzer command line as a student types it: checked, pointed at the lab's Triton, run,
and its report read back as the lab's runs.

    perf_analyzer -m food_classifier_onnx --concurrency-range 1:8:4 -i grpc

The line is perf_analyzer's own syntax; the lab adds only where the server is (`-u`, the lab's
Triton for the protocol chosen with `-i`) and where the report goes (`-f`), and refuses a line
that sets either itself: a load test aims at the lab's server, on 127.0.0.1, nothing else. Every
other option goes to perf_analyzer unchanged, and perf_analyzer's own message says what is wrong
with one it does not know.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from servelab.triton import perf_analyzer

# Options whose value the lab reads, by every spelling perf_analyzer accepts.
MODEL = ("-m", "--model-name")
PROTOCOL = ("-i", "--protocol")
BATCH = ("-b", "--batch-size")
RATE = ("--request-rate-range",)
DISTRIBUTION = ("--request-distribution",)
# Options the lab sets itself, and why a line may not.
THE_LABS = {
    "-u": "the lab points perf_analyzer at its own Triton",
    "--url": "the lab points perf_analyzer at its own Triton",
    "-f": "the lab writes perf_analyzer's report and reads it back",
    "--latency-report-file": "the lab writes perf_analyzer's report and reads it back",
}


class TypedCommandError(ValueError):
    """A typed command line the lab will not run, with what to change."""


@dataclass(frozen=True)
class TypedCommand:
    """A checked command line: perf_analyzer's arguments as typed, and what the lab reads of them."""

    arguments: list[str]  # as typed, without the program name
    model: str
    protocol: str  # "http" or "grpc"
    batch_size: int
    request_rate: float | None  # the first rate of --request-rate-range (None: a concurrency)
    distribution: str


def _values(arguments: list[str]) -> dict[str, str]:
    """The value of each option given as `-x value`, `--x value` or `--x=value`."""
    found = {}
    for index, word in enumerate(arguments):
        name, equals, value = word.partition("=")
        if equals and name.startswith("--"):
            found[name] = value
        elif word.startswith("-") and index + 1 < len(arguments) and not arguments[index + 1].startswith("-"):
            found[word] = arguments[index + 1]
    return found


def _first(values: dict[str, str], spellings: tuple[str, ...]) -> str | None:
    return next((values[name] for name in spellings if name in values), None)


def parse(line: str, models: list[str]) -> TypedCommand:
    """Check a typed line: perf_analyzer, one of `models`, a protocol the lab serves, and neither
    of the options the lab sets. A line that fails says what to change."""
    try:
        words = shlex.split(line)
    except ValueError as unparsable:
        raise TypedCommandError(f"the line does not parse ({unparsable}): check its quotes") from None
    if not words or Path(words[0]).name != "perf_analyzer":
        raise TypedCommandError(f"start the line with perf_analyzer, then its options: {line!r}")
    arguments = words[1:]
    for word in arguments:
        name = word.partition("=")[0]
        if name in THE_LABS:
            raise TypedCommandError(f"leave {name} out: {THE_LABS[name]}")
    values = _values(arguments)
    model = _first(values, MODEL)
    if model is None:
        raise TypedCommandError(f"name the model with -m: one of {', '.join(models)}")
    if model not in models:
        raise TypedCommandError(f"-m {model}: the lab's Triton serves no such model; one of {', '.join(models)}")
    protocol = _first(values, PROTOCOL) or "http"
    if protocol not in ("http", "grpc"):
        raise TypedCommandError(f"-i {protocol}: the protocol is http or grpc")
    batch = _first(values, BATCH) or "1"
    rate = _first(values, RATE)
    try:
        batch_size = int(batch)
        request_rate = float(rate.split(":")[0]) if rate else None
    except ValueError:
        raise TypedCommandError(f"-b {batch} / --request-rate-range {rate}: give numbers") from None
    distribution = _first(values, DISTRIBUTION) or "constant"
    return TypedCommand(arguments, model, protocol, batch_size, request_rate, distribution)


def run(typed: TypedCommand, http: str, grpc: str, timeout_s: float = 300) -> perf_analyzer.PerfAnalyzerRun:
    """Run a checked line against the lab's Triton (`http` or `grpc`, host:port, by its protocol):
    each load level of its report as one of the lab's runs, named for the line."""
    url = grpc if typed.protocol == "grpc" else http
    command = [str(perf_analyzer.binary()), "-u", url, *typed.arguments, "-f", perf_analyzer.REPORT]
    stdout, rows = perf_analyzer.execute(command, timeout_s)
    name = f"triton/{typed.model} ({typed.protocol}), typed"
    results = [
        perf_analyzer.to_run_result(
            row, name, typed.batch_size, typed.request_rate, typed.distribution, stdout, command
        )
        for row in rows
    ]
    return perf_analyzer.PerfAnalyzerRun(command, rows, stdout, results)
