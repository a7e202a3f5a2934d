"""Generate the notebooks from their jupytext sources (notebooks/*.py, percent format): the
instructor's, notebooks/*.ipynb, with the answers (what nbmake runs), and the student's,
notebooks/student/*.ipynb, with each answer cleared by nbgrader (servelab.lab.your_turn says how).

The .py files are the source of truth: edit them, then run `make notebooks`. The generated
notebooks carry no outputs; tests/test_notebooks_sources.py fails when they drift.

What follows from the lab's order and its measured runs is derived here, never written in a source:
- each notebook's time, under its title (servelab.time_plan: its words, its recorded full-profile
  run time in notebooks/run_times.json, its steps), and the whole plan, docs/time-plan.md;
- a last cell naming the notebook that comes next (the numbered lessons by number, then the
  appendices): a new lesson is linked from the one before it by this step alone.
A notebook with no recorded run time is generated without its time, so that it can be run and its
time recorded; then this step says how, and fails.

Each notebook also carries its time limits in its metadata, so that `pytest --nbmake
notebooks/*.ipynb` needs no flag: `execution.timeout`, per cell, which nbmake and
servelab.lab.notebook_runs read, and `servelab.notebook_timeout_s`, for the whole notebook, which
the root conftest.py gives nbmake's item as its pytest-timeout limit (pyproject.toml's 300 s is a
test's, too short for a notebook).
"""

import hashlib
import sys
from pathlib import Path

import jupytext
import nbformat

from servelab import node_plan, time_plan
from servelab.lab import your_turn

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
# The plan as the docs show it: the one place its figures are written, which README and the guides link to.
PLAN_PAGE = ROOT / "docs" / "time-plan.md"
# Per cell: the longest cells (notebooks 6, 7 and 9's sweeps, several runs in one cell) take a few
# minutes in the full profile on a 2-core machine, more on one shared with other work; 1200 s leaves
# them that room while a hung cell still fails with its source and traceback (nbmake's report).
CELL_TIMEOUT_S = 1200
# Per notebook: the longest take about 540 s in the full profile (notebook 9: 537 s; notebook 6,
# before its split into 6 and 7: 461 s; on 2 cores), and the session's servers start within an
# item's time; 1500 s is nearly three times that, and well under CI's 90 minutes, so a hang fails
# this notebook, not the whole run.
NOTEBOOK_TIMEOUT_S = 1500


def next_text(after: Path) -> str:
    """The cell that names the notebook after this one, with its title."""
    optional = ", optional" if after.stem.startswith(time_plan.APPENDIX_PREFIX) else ""
    return f"**Next**{optional}: `{after.stem}.ipynb`, *{time_plan.title(after.read_text())}*."


def instructor_notebook(source: Path, time: time_plan.NotebookTime | None, after: Path | None):
    """The instructor's notebook of `source`, with its time (where it has one) under its title and,
    where another comes after it, a last cell naming that one."""
    notebook = jupytext.read(source)
    notebook.metadata.pop("jupytext", None)
    notebook.metadata["kernelspec"] = {"display_name": "Python 3", "language": "python", "name": "python3"}
    notebook.metadata["execution"] = {"timeout": CELL_TIMEOUT_S}
    notebook.metadata["servelab"] = {"notebook_timeout_s": NOTEBOOK_TIMEOUT_S}
    if time is not None:
        first = notebook.cells[0]
        heading, _, rest = first.source.partition("\n")
        first.source = f"{heading}\n\n{time.statement()}\n{rest}".rstrip("\n")
    if after is not None:
        notebook.cells.append(nbformat.v4.new_markdown_cell(next_text(after)))
    # Cell ids from the cells' text, not random: regenerating an unchanged notebook changes nothing.
    seen: set[str] = set()
    for cell in notebook.cells:
        cell_id = hashlib.sha1(cell.source.encode()).hexdigest()[:8]
        while cell_id in seen:
            cell_id = hashlib.sha1(cell_id.encode()).hexdigest()[:8]
        seen.add(cell_id)
        cell.id = cell_id
    your_turn.mark_solution_cells(notebook, source.stem)
    return notebook


def instructor_notebooks(folder: Path = NOTEBOOKS) -> tuple[dict[Path, nbformat.NotebookNode], list[str]]:
    """Each source's instructor notebook, in the lab's order, and for each notebook with no recorded
    run time (generated without its time) the message that says how to record it."""
    sources = time_plan.notebook_sources(folder)
    measured = time_plan.run_times(folder / time_plan.RUN_TIMES.name)
    built: dict[Path, nbformat.NotebookNode] = {}
    unmeasured: list[str] = []
    for source, after in zip(sources, [*sources[1:], None], strict=True):
        time = None
        try:
            time = time_plan.notebook_time(source, measured, node_plan.PLANNING_DOWNLOAD_MB_PER_S)
        except time_plan.NotMeasured as exc:
            unmeasured.append(str(exc))
        built[source] = instructor_notebook(source, time, after)
    return built, unmeasured


def main(folder: Path = NOTEBOOKS, plan_page: Path = PLAN_PAGE) -> int:
    built, unmeasured = instructor_notebooks(folder)
    student = folder / "student"
    student.mkdir(exist_ok=True)
    for source, notebook in built.items():
        jupytext.write(notebook, source.with_suffix(".ipynb"), fmt="ipynb")
        jupytext.write(your_turn.student_notebook(notebook), student / f"{source.stem}.ipynb", fmt="ipynb")
        print(f"{source.name} -> {source.stem}.ipynb and student/{source.stem}.ipynb", file=sys.stderr)
    if unmeasured:
        print("generated without their time:", *unmeasured, sep="\n  ", file=sys.stderr)
        return 1
    page = time_plan.plan_page(time_plan.plan(folder))
    if not plan_page.is_file() or plan_page.read_text() != page:
        plan_page.write_text(page)
        print(f"wrote {plan_page.name}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
