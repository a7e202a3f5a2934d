"""Run the lab's notebooks as a student runs them, and keep them with their outputs: how an
instructor runs the full profile and reads what each cell printed.

    python -m servelab.lab.notebook_runs 6_triton_bench.ipynb 9_concurrency_target.ipynb --executed-to DIR
    python -m servelab.lab.notebook_runs appendix_triton_crash.ipynb    # an appendix runs the same way

With `--record-times` (full profile only), each notebook that passes has its run time written to
notebooks/run_times.json, where the time plan reads it (servelab.time_plan), with the seconds its
CPU-only cells took apart (`cpu_only_seconds`: the cells tagged `cpu_only`, which a GPU skips).

A notebook is executed from the top in a fresh kernel (nbclient), each cell within the limit its
metadata gives (`execution.timeout`, written by scripts/build_notebooks.py, as nbmake reads it).
Its verdicts are checked by the notebook itself: `lab.verdicts()`, in the last cells of every
notebook that judges expectations, checks that its saved runs are the runs of its table, every
field equal, each verdict's figures against those saved runs, and that every claim about the
lab's software held (a LabFault otherwise, which fails the cell, and so the run). The tests run
the same notebooks through nbmake (`pytest --nbmake`).
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from pathlib import Path

from servelab import paths, time_plan
from servelab.service.hardware import machine_info
from servelab.settings import settings

NOTEBOOKS = paths.REPO_ROOT / "notebooks"


# The lab's notebooks: the numbered lessons ("10_cancellation"), then the appendices
# ("appendix_triton_crash": optional exercises, part of neither part of the lab), each built,
# checked and run as the lessons are.
def order(name: str) -> tuple[int, int, str]:
    """Where notebook `name` (a file name or stem) comes: the lessons by number (10 after 9), then
    the appendices by name."""
    return time_plan.order_key(Path(name).stem)


def sources(folder: Path = NOTEBOOKS, suffix: str = ".py") -> list[Path]:
    """The notebooks' jupytext sources (with `suffix` ".ipynb": the generated notebooks), lessons
    then appendices (`order`)."""
    return time_plan.notebook_sources(folder, suffix)


def judging(folder: Path = NOTEBOOKS) -> list[str]:
    """The notebooks that judge expectations (their source calls `lab.expect(` or `lab.record(`), by
    file name."""
    return sorted(
        source.with_suffix(".ipynb").name
        for source in sources(folder)
        if any(call in source.read_text() for call in ("lab.expect(", "lab.record("))
    )


def run_notebook(name: str, executed_to: Path | None = None):
    """Execute notebooks/`name` from the top, and return it with its outputs and each cell's timing
    (nbclient's, in the cell's metadata); a failing cell (a verdict's LabFault included) raises
    nbclient's error, which names the cell and quotes its traceback. With `executed_to`, the
    notebook with its outputs is written there, also when a cell fails."""
    import nbformat
    from nbclient import NotebookClient

    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    client = NotebookClient(
        notebook,
        timeout=notebook.metadata["execution"]["timeout"],
        kernel_name="python3",
        resources={"metadata": {"path": str(NOTEBOOKS)}},
    )
    try:
        client.execute()
    finally:
        if executed_to is not None:
            executed_to.mkdir(parents=True, exist_ok=True)
            nbformat.write(notebook, executed_to / name)
    return notebook


def seconds_of_tagged_cells(notebook, tag: str = time_plan.ONLY_ON[time_plan.CPU]) -> float:
    """The seconds the cells tagged `tag` took to run, from the timing nbclient wrote in each
    executed cell's metadata (from its input reaching the kernel to the kernel's reply)."""
    total = 0.0
    for cell in notebook.cells:
        timing = cell.get("metadata", {}).get("execution", {})
        if tag in cell.get("metadata", {}).get("tags", []) and {"iopub.execute_input", "shell.execute_reply"} <= set(
            timing
        ):
            started = datetime.datetime.fromisoformat(timing["iopub.execute_input"])
            total += (datetime.datetime.fromisoformat(timing["shell.execute_reply"]) - started).total_seconds()
    return total


def machine() -> str:
    """This machine in the words a run time is recorded with: its cores and GPUs."""
    info = machine_info()
    gpus = [gpu for gpu in info["gpus"] if gpu != "none"]
    return f"{info['cores']} CPU cores, " + (
        f"{len(gpus)} GPU(s): {', '.join(sorted(set(gpus)))}" if gpus else "no GPU"
    )


def record_time(name: str, seconds: float, path: Path = time_plan.RUN_TIMES, cpu_only_seconds: float = 0) -> None:
    """Write a full-profile run time of notebook `name` (its file name) where the time plan reads it,
    with the seconds of its CPU-only cells apart where it has some."""
    recorded = time_plan.run_times(path)
    recorded[Path(name).stem] = {
        "seconds": round(seconds),
        "date": datetime.date.today().isoformat(),
        "machine": machine(),
        **({"cpu_only_seconds": round(cpu_only_seconds)} if cpu_only_seconds else {}),
    }
    path.write_text(json.dumps(dict(sorted(recorded.items(), key=lambda item: order(item[0]))), indent=1) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m servelab.lab.notebook_runs", description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="+", help="file names in notebooks/, e.g. 4_fastapi_bench.ipynb")
    parser.add_argument("--executed-to", type=Path, help="a folder to write each notebook to, with its outputs")
    parser.add_argument(
        "--record-times", action="store_true", help="write each passing notebook's run time for the time plan"
    )
    args = parser.parse_args(argv)
    if args.record_times and settings().profile != "full":
        parser.error(f"--record-times records full-profile times; LAB_PROFILE is {settings().profile!r}")
    failed = []
    for name in args.notebooks:
        started = time.monotonic()
        print(f"--- {name}: running", file=sys.stderr, flush=True)
        try:
            executed = run_notebook(name, executed_to=args.executed_to)
        except Exception as exc:  # a failing cell: nbclient's message names it and quotes the traceback
            print(f"FAILED {name} ({time.monotonic() - started:.0f} s): {exc}", file=sys.stderr, flush=True)
            failed.append(name)
            continue
        took = time.monotonic() - started
        print(f"PASSED {name} ({took:.0f} s)", file=sys.stderr, flush=True)
        if args.record_times:
            record_time(name, took, cpu_only_seconds=seconds_of_tagged_cells(executed))
    print(f"{len(args.notebooks) - len(failed)} passed, {len(failed)} failed", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
