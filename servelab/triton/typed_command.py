"""A perf_analyzer command line as a student types it: checked, pointed at the lab's Triton, run,
and its report read back as the lab's runs.

    perf_analyzer -m food_classifier_onnx --concurrency-range 1:8:4 -i grpc

The line is perf_analyzer's own syntax; the lab adds only where the server is (`-u`, the lab's
Triton for the protocol chosen with `-i`) and where the report goes (`-f`), and refuses a line
that sets either itself: a load test aims at the lab's server, on 127.0.0.1, nothing else. Every
other option goes to perf_analyzer unchanged, and perf_analyzer's own message says what is wrong
with one it does not know. perf_analyzer runs, without a word, a line with an option that its CLI
guide (docs/cli.md) says it ignores beside another (`--measurement-request-count` in the default
time windows): the lab refuses such a line and says what to type for the option to take effect.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Collection
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
class Options:
    """What a typed line sets: each option's value (`values`), and every option named (`named`,
    flags too), by the spelling typed."""

    values: dict[str, str]
    named: set[str]
    stateful: bool  # the model is sequence-batched: perf_analyzer then runs it asynchronously

    def given(self, spellings: tuple[str, ...]) -> str | None:
        """The spelling of `spellings` the line uses, if any."""
        return next((name for name in spellings if name in self.named), None)

    def value(self, spellings: tuple[str, ...]) -> str | None:
        return _first(self.values, spellings)


@dataclass(frozen=True)
class Ignored:
    """An option perf_analyzer ignores where `applies` holds (its CLI guide says so), and what to
    type instead."""

    spellings: tuple[str, ...]
    applies: Callable[[Options], bool]
    instead: str


def _count_windows(options: Options) -> bool:
    return options.value(("--measurement-mode",)) == "count_windows"


def _synchronous_with_an_end(options: Options) -> bool:
    asynchronous = options.given(("-a", "--async")) or (options.stateful and not options.given(("--sync",)))
    return not asynchronous and ":" in (options.value(("--concurrency-range",)) or "")


def _json_or_folder_data(options: Options) -> bool:
    return options.value(("--input-data",)) not in (None, "zero", "random")


IGNORED = (
    Ignored(
        ("--measurement-request-count",),
        lambda options: not _count_windows(options),
        "it counts requests only in count windows: add --measurement-mode count_windows (the default, "
        "time_windows, measures for --measurement-interval ms)",
    ),
    Ignored(
        ("-p", "--measurement-interval"),
        _count_windows,
        "count windows last until --measurement-request-count requests are done: give that instead, or drop "
        "--measurement-mode count_windows",
    ),
    Ignored(
        ("--request-distribution",),
        lambda options: not options.given(RATE),
        "it spaces requests only at a request rate: add --request-rate-range, or drop it",
    ),
    Ignored(
        ("--num-of-sequences",),
        lambda options: not options.given(RATE),
        "it sets the live sequences only at a request rate: add --request-rate-range (at a concurrency, each "
        "request in flight is its own sequence)",
    ),
    Ignored(
        ("--request-period",),
        lambda options: not options.given(("--periodic-concurrency-range",)),
        "it paces only --periodic-concurrency-range: add that, or drop it",
    ),
    Ignored(
        ("--max-threads",),
        _synchronous_with_an_end,
        "in synchronous mode with a --concurrency-range that has an end, perf_analyzer starts one thread per "
        "client: add -a (asynchronous mode), or drop it",
    ),
    Ignored(
        ("-H",),
        lambda options: options.value(PROTOCOL) == "grpc",
        "headers go with HTTP requests only: drop -i grpc, or drop -H",
    ),
    Ignored(
        ("--input-tensor-format", "--output-tensor-format"),
        lambda options: options.value(PROTOCOL) == "grpc",
        "tensor formats apply over HTTP only: drop -i grpc, or drop the format",
    ),
    Ignored(
        ("--string-length",),
        lambda options: bool(options.given(("--string-data",)) or _json_or_folder_data(options)),
        "the strings come from --string-data or --input-data: drop --string-length, or them",
    ),
    Ignored(
        ("--string-data",),
        _json_or_folder_data,
        "the strings come from the --input-data file: drop one of the two",
    ),
    Ignored(
        ("--model-signature-name",),
        lambda options: options.value(("--service-kind",)) != "tfserving",
        "a signature name is for TensorFlow Serving (--service-kind tfserving), not Triton: drop it",
    ),
)


def _refuse_ignored(options: Options) -> None:
    """Refuse a line with an option perf_analyzer would ignore beside the others, saying what to type."""
    for rule in IGNORED:
        name = options.given(rule.spellings)
        if name is not None and rule.applies(options):
            value = options.values.get(name)
            typed = f"{name} {value}" if value is not None else name
            raise TypedCommandError(f"perf_analyzer would ignore {typed} in this line: {rule.instead}")


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


def parse(line: str, models: list[str], sequence_models: Collection[str] = ()) -> TypedCommand:
    """Check a typed line: perf_analyzer, one of `models` (`sequence_models` among them are
    sequence-batched), a protocol the lab serves, neither of the options the lab sets, and no
    option that perf_analyzer would ignore beside the others. A line that fails says what to change."""
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
    named = {word.partition("=")[0] for word in arguments if word.startswith("-")}
    _refuse_ignored(Options(values, named, model in sequence_models))
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
