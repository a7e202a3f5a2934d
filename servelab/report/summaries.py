"""The lab's text for a student, in a line: a run's summary as the lab prints it when the run
ends, a command line and a path as a student reads them, words listed as a sentence lists them."""

from __future__ import annotations

import math
import shlex
from pathlib import Path

from servelab import paths
from servelab.results import RunResult, SequenceRunResult


def summary_line(result: RunResult) -> str:
    """A run's figures in one line; under it, the command that measured it, for a tool run by one."""
    line = _summary(result)
    if not result.clean:
        line = f"{line} -- NOT A CLEAN RUN: {'; '.join(result.interrupted_by)}"
    return line if result.command is None else f"{line}\n  command: {shown_command(result.command)}"


def _summary(result: RunResult) -> str:
    latency = result.latency
    errors = f", {result.error_count} errors" if result.error_count else ""
    tail = ", ".join(
        f"p{p} {result.latency_ms(p):.1f} ms" if math.isfinite(result.latency_ms(p)) else f"p{p} n/a (too few requests)"
        for p in (95, 99)
    )
    if isinstance(result, SequenceRunResult):
        failed = sum(result.sequences_failed.values())
        skipped = f", {result.frames_skipped} frames skipped" if result.frames_skipped else ""
        return (
            f"{result.label}: {result.throughput_rps:.1f} frames/s, frame p50 {latency.p50_ms:.1f} ms, {tail}; "
            f"{result.sequences_completed} of {result.sequences} sequences completed"
            + (f", {failed} broken off ({result.sequences_failed})" if failed else "")
            + skipped
        )
    return (
        f"{result.label}: {result.throughput_rps:.1f} req/s, p50 {latency.p50_ms:.1f} ms, {tail} "
        f"({result.requests} requests{errors})"
    )


def shown_command(command: list[str]) -> str:
    """A command line as a student reads it: the program by its name, a file by its path from the
    repository's root, each argument quoted for a shell where it needs to be."""
    program, *arguments = command
    return shlex.join([Path(program).name, *(shown_path(Path(a)) if Path(a).is_absolute() else a for a in arguments)])


def shown_path(path: Path) -> str:
    """A path as a student reads it: relative to the repository when it is inside it."""
    return str(path.relative_to(paths.REPO_ROOT)) if path.is_relative_to(paths.REPO_ROOT) else str(path)


def listed(words: list[str]) -> str:
    """The words as a sentence lists them: "a, b and c"."""
    return ", ".join(words[:-1]) + " and " + words[-1] if len(words) > 1 else "".join(words)
