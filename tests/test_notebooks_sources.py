"""Notebooks are generated from their jupytext sources and committed without outputs."""

import json
import re

import jupytext
import pytest

from servelab import paths

NOTEBOOKS = paths.REPO_ROOT / "notebooks"


def lesson_number(path) -> int:
    return int(path.name.split("_")[0])


SOURCES = sorted(NOTEBOOKS.glob("[0-9]*.py"), key=lesson_number)  # 10 after 9, not after 1


def test_every_numbered_notebook_has_a_source_and_the_sequence_is_complete():
    assert [source.name.split("_")[0] for source in SOURCES] == [str(n) for n in range(len(SOURCES))]
    generated = sorted(NOTEBOOKS.glob("[0-9]*.ipynb"), key=lesson_number)
    assert generated == [source.with_suffix(".ipynb") for source in SOURCES]


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.name)
def test_committed_notebook_matches_its_source(source):
    expected = jupytext.read(source)
    committed = jupytext.read(source.with_suffix(".ipynb"))
    as_pairs = lambda nb: [(cell.cell_type, cell.source.strip()) for cell in nb.cells]  # noqa: E731
    assert as_pairs(committed) == as_pairs(expected), f"{source.name} changed: run `make notebooks`"


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.name)
def test_committed_notebook_has_no_outputs(source):
    notebook = json.loads(source.with_suffix(".ipynb").read_text())
    for cell in notebook["cells"]:
        if cell["cell_type"] == "code":
            assert cell.get("outputs") == [] and cell.get("execution_count") is None


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.name)
def test_a_notebook_that_measures_saves_its_runs_under_its_own_name(source):
    """Lab.connect's first argument names the file its runs are saved to (results/notebooks/)."""
    calls = re.findall(r"^lab = Lab\.connect\(([^)]*)\)", source.read_text(), flags=re.MULTILINE)
    for arguments in calls:
        assert arguments.split(",")[0].strip() == f'"{source.stem}"', f"{source.name}: Lab.connect({arguments})"
