"""How long each notebook takes, computed from figures, never typed: what each generated notebook
states at its top, docs/time-plan.md, and the lease plan notebook 1 prints.

A notebook's minutes are its reading (its Markdown's words), its running (its full-profile run
time as `python -m servelab.lab.notebook_runs --record-times` measured it; notebook 2's, the node's
set-up, servelab.node_plan) and its hands-on steps (answers the student types, predictions the
student writes down). A code cell tagged for one kind of machine (`# %% tags=["cpu_only"]`) counts
only on the machine its notebook's part runs on (`machine_of`); such a notebook states the other
machine's minutes too.

    python -m servelab.time_plan    # the plan, notebook by notebook, and the two parts

`make notebooks` (scripts/build_notebooks.py) writes each notebook's time under its title in the
generated notebooks, and the plan into docs/time-plan.md, where the docs link: the sources state
no time of their own.

Standard library only: notebook 1 runs on Chameleon's own Jupyter server, where none of the lab's
other packages are installed.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from servelab import node_plan

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
RUN_TIMES = NOTEBOOKS / "run_times.json"

READING_WORDS_PER_MINUTE = 200
# Stated allowances, not measured: doing a step (typing a command or an edit, running it, reading
# what it printed), and writing down a prediction after reading what the experiment does.
HANDS_ON_MINUTES = 3.0
PREDICTION_MINUTES = 1.0
# Part 1 (the original lab) runs on the GPU node, in a lease; part 2, every lesson after it, anywhere.
PART_1 = range(0, 8)
# Triton's image builds while the student works through these (servelab.node_build).
FASTAPI_NOTEBOOKS = (3, 4)
# An appendix (`appendix_<name>.py`) is optional and in neither part.
APPENDIX_PREFIX = "appendix_"
# The machine each part's notebooks run on: part 1's, the GPU node; the others', any machine, a CPU's.
GPU, CPU = "gpu", "cpu"
# The tag of a code cell that does its work on one kind of machine only (see the module's docstring).
ONLY_ON = {CPU: "cpu_only", GPU: "gpu_only"}
# The lease's end: copying the notebooks and results off the node, bringing the project down.
WRAP_UP_MINUTES = 10.0

_CELL = re.compile(r"^# %%(.*)$", re.M)
_TAGS = re.compile(r"tags=\[([^\]]*)\]")
_WORD = re.compile(r"[A-Za-z0-9][\w'.-]*")
_PREDICTION = re.compile(r"^predicted_\w+ = ", re.M)
# nbgrader's marker of an answer region, which the student's copy clears (servelab.lab.your_turn).
ANSWER = "### BEGIN SOLUTION"


class NotMeasured(ValueError):
    """A notebook with no recorded run time: its message says how to record one."""


@dataclass(frozen=True)
class NotebookTime:
    name: str  # the source's stem, "6_triton_bench"
    title: str  # "6. Benchmarking Triton: queueing and instances"
    words: int
    run_minutes: float
    run_source: str
    hands_on: int
    predictions: int
    machine: str = CPU  # the machine the counts are for (GPU: the node's, CPU-only cells left out)
    elsewhere: float | None = None  # its minutes on the other kind of machine, where some cells run on one only

    @property
    def number(self) -> int | None:
        """Its place in the sequence; None for an appendix, which is in neither part."""
        return int(self.name.split("_", 1)[0]) if self.name[0].isdigit() else None

    @property
    def part(self) -> int | None:
        """1 (in the lease), 2 (every lesson after part 1), or None for an appendix."""
        return None if self.number is None else 1 if self.number in PART_1 else 2

    @property
    def reading_minutes(self) -> float:
        return self.words / READING_WORDS_PER_MINUTE

    @property
    def hands_on_minutes(self) -> float:
        return self.hands_on * HANDS_ON_MINUTES + self.predictions * PREDICTION_MINUTES

    @property
    def minutes(self) -> float:
        return self.reading_minutes + self.run_minutes + self.hands_on_minutes

    def statement(self) -> str:
        """The line a notebook opens with: its time and the parts it is made of."""
        other = "without a GPU" if self.machine == GPU else "on a GPU"
        elsewhere = f"; {round(self.elsewhere)} {other}" if self.elsewhere is not None else ""
        return (
            f"**Time:** about {round(self.minutes)} minutes ({self.reading_minutes:.0f} reading, "
            f"{self.run_minutes:.0f} running, {self.hands_on_minutes:.0f} hands-on{elsewhere}; "
            "`python -m servelab.time_plan`)"
        )


def tagged_cells(source: str) -> list[tuple[bool, set[str], str]]:
    """A jupytext source's cells, in order: (is it Markdown, its tags, its lines as written)."""
    parts = _CELL.split(source)
    return [
        (
            "[markdown]" in header,
            set(re.findall(r'"([^"]*)"', found[1])) if (found := _TAGS.search(header)) else set(),
            body,
        )
        for header, body in zip(parts[1::2], parts[2::2], strict=True)
    ]


def code_cells(source: str, machine: str | None = None) -> list[str]:
    """The text of a jupytext (percent format) source's code cells; with `machine`, those that do
    their work there (a cell tagged for the other machine only left out)."""
    others = {tag for kind, tag in ONLY_ON.items() if kind != machine} if machine else set()
    return [body for markdown, tags, body in tagged_cells(source) if not markdown and not tags & others]


def machine_only(source: str) -> bool:
    """Whether some of a source's cells do their work on one kind of machine only."""
    return any(tags & set(ONLY_ON.values()) for _markdown, tags, _body in tagged_cells(source))


def markdown_cells(source: str) -> list[str]:
    """The text of a jupytext (percent format) source's Markdown cells, without the comment marks."""
    return [
        "\n".join(line[2:] if line.startswith("# ") else line.lstrip("#") for line in body.splitlines())
        for markdown, _tags, body in tagged_cells(source)
        if markdown
    ]


def prose_words(source: str) -> int:
    """Words of prose: the Markdown cells' words."""
    return sum(len(_WORD.findall(cell)) for cell in markdown_cells(source))


def title(source: str) -> str:
    """A notebook's title: the heading its first cell, a Markdown one, opens with ("6. Benchmarking
    Triton: queueing and instances")."""
    opens_with_markdown = tagged_cells(source)[:1] and tagged_cells(source)[0][0]
    heading = markdown_cells(source)[0].strip().partition("\n")[0] if opens_with_markdown else ""
    if not heading.startswith("# "):
        raise ValueError("no title: a notebook opens with a Markdown cell whose first line is `# # <N>. <title>`")
    return heading[2:]


def count_steps(source: str, machine: str | None = None) -> tuple[int, int]:
    """(hands-on steps, predictions): the answers the student types (regions the student's copy
    clears), and the `predicted_...` variables the student sets before a run; with `machine`, in
    the cells that do their work there."""
    kept = code_cells(source, machine)
    return sum(cell.count(ANSWER) for cell in kept), sum(len(_PREDICTION.findall(cell)) for cell in kept)


def run_times(path: Path = RUN_TIMES) -> dict[str, dict]:
    """The measured full-profile run times, by notebook (empty where none was recorded)."""
    return json.loads(path.read_text()) if path.is_file() else {}


def machine_of(stem: str) -> str:
    """The machine a notebook (its file's stem) runs on in its part: part 1's on the GPU node."""
    number = order_key(stem)[1] if stem[0].isdigit() else None
    return GPU if number in PART_1 else CPU


def notebook_time(
    source_path: Path, measured: dict[str, dict], download_mb_per_s: float, machine: str | None = None
) -> NotebookTime:
    """A notebook's time on `machine` (by default its part's, `machine_of`), with its time on the
    other kind of machine where some of its cells run on one only."""
    source, name = source_path.read_text(), source_path.stem
    machine = machine or machine_of(name)
    time = _time_on(machine, source, name, measured, download_mb_per_s)
    if not machine_only(source):
        return time
    other = _time_on(CPU if machine == GPU else GPU, source, name, measured, download_mb_per_s)
    return dataclasses.replace(time, elsewhere=other.minutes)


def _time_on(machine: str, source: str, name: str, measured: dict[str, dict], download_mb_per_s: float) -> NotebookTime:
    hands_on, predictions = count_steps(source, machine)
    if name.startswith("2_"):
        run = sum(step.minutes for step in node_plan.setup_steps(download_mb_per_s))
        run_source = "the node's set-up (servelab.node_plan)"
    elif name in measured:
        entry = measured[name]
        left_out = entry.get("cpu_only_seconds", 0) if machine == GPU else 0
        run = (entry["seconds"] - left_out) / 60
        run_source = f"measured {entry['date']}, full profile, {entry['machine']}" + (
            f", less its CPU-only cells' {left_out} s" if left_out else ""
        )
    else:
        raise NotMeasured(
            f"{name} has no measured run time in {RUN_TIMES.name}: run it in the full profile with "
            f"`LAB_PROFILE=full python -m servelab.lab.notebook_runs {name}.ipynb --record-times`, "
            "then `make notebooks` again"
        )
    return NotebookTime(name, title(source), prose_words(source), run, run_source, hands_on, predictions, machine)


def order_key(stem: str) -> tuple[int, int, str]:
    """Where a notebook (its file's stem) comes: by number (10 after 9), the appendices last."""
    number = stem.split("_", 1)[0]
    return (0, int(number), stem) if number.isdigit() else (1, 0, stem)


def notebook_sources(folder: Path = NOTEBOOKS, suffix: str = ".py") -> list[Path]:
    """The notebooks' sources in the order a student takes them (with `suffix` ".ipynb": the
    generated notebooks)."""
    found = [*folder.glob(f"[0-9]*_*{suffix}"), *folder.glob(f"{APPENDIX_PREFIX}*{suffix}")]
    return sorted(found, key=lambda path: order_key(path.stem))


def plan(
    folder: Path = NOTEBOOKS, download_mb_per_s: float = node_plan.PLANNING_DOWNLOAD_MB_PER_S
) -> list[NotebookTime]:
    """Every notebook's time, in the order a student takes them."""
    measured = run_times(folder / RUN_TIMES.name)
    return [notebook_time(path, measured, download_mb_per_s) for path in notebook_sources(folder)]


def part_minutes(times: list[NotebookTime], part: int) -> float:
    return sum(time.minutes for time in times if time.part == part)


def triton_wait_minutes(
    times: list[NotebookTime], download_mb_per_s: float = node_plan.PLANNING_DOWNLOAD_MB_PER_S
) -> float:
    """How long notebook 5 waits for Triton's image, whose build starts as notebook 2 ends: what
    the build takes beyond notebooks 3 and 4."""
    fastapi_notebooks = sum(time.minutes for time in times if time.number in FASTAPI_NOTEBOOKS)
    return max(0.0, node_plan.triton_step(download_mb_per_s).minutes - fastapi_notebooks)


def part_1_minutes(times: list[NotebookTime], download_mb_per_s: float = node_plan.PLANNING_DOWNLOAD_MB_PER_S) -> float:
    """Part 1 in the lease: its notebooks, any wait for Triton's image, and the wrap-up."""
    return part_minutes(times, 1) + triton_wait_minutes(times, download_mb_per_s) + WRAP_UP_MINUTES


def lease_table(times: list[NotebookTime], download_mb_per_s: float = node_plan.PLANNING_DOWNLOAD_MB_PER_S) -> str:
    """Part 1 against the lease, as a Markdown table, with what is left of it."""
    lines = [
        "| notebook | reading | running | hands-on | minutes | running time from |",
        "| --- | ---: | ---: | ---: | ---: | --- |",
    ]
    for time in times:
        if time.part == 1:
            lines.append(
                f"| {time.name} | {time.reading_minutes:.0f} | {time.run_minutes:.0f} | {time.hands_on_minutes:.0f} | "
                f"{time.minutes:.0f} | {time.run_source} |"
            )
        if time.number == max(FASTAPI_NOTEBOOKS):
            triton = node_plan.triton_step(download_mb_per_s)
            lines.append(
                f"| wait for Triton's image, built during notebooks 3 and 4 | | | | "
                f"{triton_wait_minutes(times, download_mb_per_s):.0f} | its build takes {triton.minutes:.0f} "
                f"minutes ({triton.source}) |"
            )
    lines.append(f"| copy your work off the node, bring the project down | | | | {WRAP_UP_MINUTES:.0f} | a budget |")
    total = part_1_minutes(times, download_mb_per_s)
    left = node_plan.LEASE_MINUTES - total
    lease = node_plan.LEASE_MINUTES
    lines.append(f"| **part 1, total** | | | | **{total:.0f}** | {left:.0f} of the lease's {lease} minutes left |")
    return "\n".join(lines)


def plan_page(times: list[NotebookTime]) -> str:
    """The notebooks in order and their plan, as a Markdown page: part 1 against the lease, part 2,
    the appendices."""
    part_2 = [time for time in times if time.part == 2]
    appendices = [time for time in times if time.part is None]
    lines = [
        "# The notebooks and their time plan",
        "",
        "Written by `make notebooks` (scripts/build_notebooks.py) from each notebook's words, its recorded",
        "full-profile run time (`notebooks/run_times.json`) and its steps, and for notebook 2 from the",
        "node's planned set-up (`servelab/node_plan.py`): edit those, never this page. Each notebook",
        "states its own minutes under its title, from the same figures (`python -m servelab.time_plan`).",
        "",
        "## The notebooks, in order",
        "",
        *(f"- `{time.name}`: {time.title}" for time in times),
        "",
        f"## Part 1, in the lease (notebooks {PART_1.start}-{PART_1.stop - 1})",
        "",
        lease_table(times),
    ]
    if part_2:
        span = f"{part_2[0].number}-{part_2[-1].number}"
        lines += ["", f"## Part 2, anywhere (notebooks {span}): {part_minutes(times, 2):.0f} minutes", ""]
        lines += [f"- {time.name}: {time.minutes:.0f} min ({time.run_source})" for time in part_2]
    if appendices:
        lines += ["", "## Optional", ""]
        lines += [f"- {time.name}: {time.minutes:.0f} min ({time.run_source})" for time in appendices]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m servelab.time_plan", description=__doc__.split("\n\n")[0])
    parser.parse_args(argv)
    print(plan_page(plan()), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
