"""Generate notebooks/*.ipynb from their jupytext sources (notebooks/*.py, percent format).

The .py files are the source of truth: edit them, then run `make notebooks`. The generated
notebooks carry no outputs; tests/test_notebooks_sources.py fails when they drift.
"""

import hashlib
import sys
from pathlib import Path

import jupytext

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"


def build(source: Path) -> Path:
    notebook = jupytext.read(source)
    notebook.metadata.pop("jupytext", None)
    notebook.metadata["kernelspec"] = {"display_name": "Python 3", "language": "python", "name": "python3"}
    # Cell ids from the cells' text, not random: regenerating an unchanged notebook changes nothing.
    seen: set[str] = set()
    for cell in notebook.cells:
        cell_id = hashlib.sha1(cell.source.encode()).hexdigest()[:8]
        while cell_id in seen:
            cell_id = hashlib.sha1(cell_id.encode()).hexdigest()[:8]
        seen.add(cell_id)
        cell.id = cell_id
    target = source.with_suffix(".ipynb")
    jupytext.write(notebook, target, fmt="ipynb")
    return target


if __name__ == "__main__":
    for source in sorted(NOTEBOOKS.glob("[0-9]*.py")):
        print(f"{source.name} -> {build(source).name}", file=sys.stderr)
