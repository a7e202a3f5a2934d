"""`make notebooks` (scripts/build_notebooks.py) derives what follows from the lab's order and its
measured runs, which no source states: each notebook's time under its title, a last cell naming the
next notebook, and docs/time-plan.md; a notebook with no recorded run time is generated without
its time, and the step says how to record it."""

from __future__ import annotations

import json

import nbformat

from servelab import node_plan, paths, time_plan
from tests.helpers import file_module

build_notebooks = file_module(paths.REPO_ROOT / "scripts" / "build_notebooks.py")


def lesson(title: str) -> str:
    return f"# %% [markdown]\n# # {title}\n#\n# Words of prose.\n\n# %%\npredicted_growth = None  # True or False\n"


def toy_lab(folder) -> None:
    """Two lessons and an appendix; a run time recorded for the first and the appendix only."""
    (folder / "0_first.py").write_text(lesson("0. The first"))
    (folder / "1_added.py").write_text(lesson("1. The lesson just added"))
    (folder / "appendix_extra.py").write_text(lesson("Appendix: an extra"))
    runs = {"seconds": 120, "date": "d", "machine": "m"}
    (folder / "run_times.json").write_text(json.dumps({"0_first": runs, "appendix_extra": runs}))


def cell_texts(path) -> list[str]:
    return ["".join(cell["source"]) for cell in json.loads(path.read_text())["cells"]]


def test_each_notebook_states_its_time_under_its_title_and_ends_by_naming_the_next(tmp_path):
    toy_lab(tmp_path)
    built, unmeasured = build_notebooks.instructor_notebooks(tmp_path)
    first, added, extra = (built[tmp_path / f"{name}.py"] for name in ("0_first", "1_added", "appendix_extra"))
    measured = time_plan.run_times(tmp_path / "run_times.json")
    time = time_plan.notebook_time(tmp_path / "0_first.py", measured, node_plan.PLANNING_DOWNLOAD_MB_PER_S)
    assert first.cells[0].source == f"# 0. The first\n\n{time.statement()}\n\nWords of prose."
    assert time.statement().startswith("**Time:** about 3 minutes (0 reading, 2 running, 1 hands-on")
    assert first.cells[-1].source == "**Next**: `1_added.ipynb`, *1. The lesson just added*."
    assert added.cells[-1].source == "**Next**, optional: `appendix_extra.ipynb`, *Appendix: an extra*."
    assert extra.cells[-1].cell_type == "code", "the last notebook names none after it"
    assert added.cells[0].source == "# 1. The lesson just added\n\nWords of prose.", "no time where none was measured"
    assert unmeasured == [
        "1_added has no measured run time in run_times.json: run it in the full profile with "
        "`LAB_PROFILE=full python -m servelab.lab.notebook_runs 1_added.ipynb --record-times`, "
        "then `make notebooks` again"
    ]


def test_a_notebook_with_no_recorded_time_is_generated_and_the_step_fails_until_its_time_is_recorded(tmp_path):
    toy_lab(tmp_path)
    page = tmp_path / "time-plan.md"
    assert build_notebooks.main(tmp_path, page) == 1
    assert (tmp_path / "1_added.ipynb").is_file() and (tmp_path / "student" / "1_added.ipynb").is_file()
    assert not page.exists(), "no plan while a notebook has no time"
    recorded = json.loads((tmp_path / "run_times.json").read_text())
    recorded["1_added"] = {"seconds": 60, "date": "d", "machine": "m"}
    (tmp_path / "run_times.json").write_text(json.dumps(recorded))
    assert build_notebooks.main(tmp_path, page) == 0
    assert page.read_text() == time_plan.plan_page(time_plan.plan(tmp_path))
    assert cell_texts(tmp_path / "1_added.ipynb")[0].startswith("# 1. The lesson just added\n\n**Time:** about 2")
    assert cell_texts(tmp_path / "student" / "0_first.ipynb")[-1].startswith("**Next**: `1_added.ipynb`")


def test_the_plan_page_is_the_plan():
    """docs/time-plan.md is the one place the plan's figures are written (`make notebooks` writes
    it), where README and the guides link."""
    assert build_notebooks.PLAN_PAGE.read_text() == time_plan.plan_page(time_plan.plan()), "run `make notebooks`"


def test_generating_again_changes_nothing_and_each_notebook_is_valid(tmp_path):
    toy_lab(tmp_path)
    once, _ = build_notebooks.instructor_notebooks(tmp_path)
    again, _ = build_notebooks.instructor_notebooks(tmp_path)
    for source, notebook in once.items():
        assert [cell.id for cell in notebook.cells] == [cell.id for cell in again[source].cells]
        nbformat.validate(notebook)
