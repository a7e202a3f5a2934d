"""Generate the notebooks from their jupytext sources (notebooks/*.py, percent format): the
instructor's, notebooks/*.ipynb, with the answers (what nbmake runs), and the student's,
notebooks/student/*.ipynb, with each answer cleared by nbgrader (servelab.lab.your_turn says how).

The .py files are the source of truth: edit them, then run `make notebooks`. The generated
notebooks carry no outputs; tests/test_notebooks_sources.py fails when they drift.

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

from servelab.lab import your_turn

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
STUDENT = NOTEBOOKS / "student"
# Per cell: the longest cells (notebooks 6, 7 and 9's sweeps, several runs in one cell) take a few
# minutes in the full profile on a 2-core machine, more on one shared with other work; 1200 s leaves
# them that room while a hung cell still fails with its source and traceback (nbmake's report).
CELL_TIMEOUT_S = 1200
# Per notebook: the longest take about 540 s in the full profile (notebook 9: 537 s; notebook 6,
# before its split into 6 and 7: 461 s; on 2 cores), and the session's servers start within an
# item's time; 1500 s is nearly three times that, and well under CI's 90 minutes, so a hang fails
# this notebook, not the whole run.
NOTEBOOK_TIMEOUT_S = 1500


def build(source: Path) -> Path:
    notebook = jupytext.read(source)
    notebook.metadata.pop("jupytext", None)
    notebook.metadata["kernelspec"] = {"display_name": "Python 3", "language": "python", "name": "python3"}
    notebook.metadata["execution"] = {"timeout": CELL_TIMEOUT_S}
    notebook.metadata["servelab"] = {"notebook_timeout_s": NOTEBOOK_TIMEOUT_S}
    # Cell ids from the cells' text, not random: regenerating an unchanged notebook changes nothing.
    seen: set[str] = set()
    for cell in notebook.cells:
        cell_id = hashlib.sha1(cell.source.encode()).hexdigest()[:8]
        while cell_id in seen:
            cell_id = hashlib.sha1(cell_id.encode()).hexdigest()[:8]
        seen.add(cell_id)
        cell.id = cell_id
    your_turn.mark_solution_cells(notebook, source.stem)
    target = source.with_suffix(".ipynb")
    jupytext.write(notebook, target, fmt="ipynb")
    STUDENT.mkdir(exist_ok=True)
    jupytext.write(your_turn.student_notebook(notebook), STUDENT / target.name, fmt="ipynb")
    return target


if __name__ == "__main__":
    # The numbered lessons and the appendices (as servelab.lab.notebook_runs.sources finds them).
    for source in sorted([*NOTEBOOKS.glob("[0-9]*.py"), *NOTEBOOKS.glob("appendix_*.py")]):
        print(f"{source.name} -> {build(source).name} and student/{source.stem}.ipynb", file=sys.stderr)
