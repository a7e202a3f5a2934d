"""What a student reads (tests/helpers/reading_budget.py): words of prose and lab names per notebook,
counted as the docstring says, and each notebook within its budgets."""

from __future__ import annotations

import pytest

from servelab import time_plan
from tests.helpers import reading_budget

TOY = """# %% [markdown]
# # 9. A title
#
# `lab.hidden()` in prose is not code.

# %%
%matplotlib inline
from servelab.lab import Lab, plots
from servelab.lessons import triton_bench
from servelab.triton.perf_analyzer import PerfAnalyzerError
import servelab.paths as paths

lab = Lab.connect()
run = lab.triton.perf("m", concurrency=1)
lab.table([run])
lab.fastapi_urls.items()
plots.plot_queueing(run)
lab.record(triton_bench.queueing_grows(run), predicted=True)
print(paths.REPO_ROOT)
try:
    lab.triton.perf("m")
except PerfAnalyzerError as error:
    print(error)
"""


def test_lab_names_are_what_a_cell_uses_of_the_lab_each_once():
    assert reading_budget.lab_names(TOY) == {
        "Lab.connect",
        "lab.triton.perf",  # the Triton side's methods count one level deeper
        "lab.table",
        "lab.fastapi_urls",  # what follows (.items) is Python's
        "plots.plot_queueing",  # a module imported counts by what is used of it, not itself
        "lab.record",
        "paths.REPO_ROOT",
        "PerfAnalyzerError",  # used on its own: caught
    }


def test_a_check_recorded_is_counted_apart_unless_the_notebook_uses_it_otherwise():
    assert reading_budget.lesson_checks(TOY) == {"triton_bench.queueing_grows"}
    assert "triton_bench.queueing_grows" not in reading_budget.lab_names(TOY)
    shown = TOY + "print(triton_bench.queueing_grows)\n"
    assert "triton_bench.queueing_grows" in reading_budget.lab_names(shown)


def test_a_source_over_a_budget_is_named_with_what_to_cut(tmp_path):
    wordy = TOY.replace("is not code.", "is not code. " + "word " * reading_budget.WORD_BUDGET)
    (tmp_path / "9_toy.py").write_text(wordy)
    (tmp_path / "0_intro.py").write_text(wordy)
    assert reading_budget.over_budget(tmp_path / "0_intro.py") == []  # notebook 0 has a larger budget
    (over,) = reading_budget.over_budget(tmp_path / "9_toy.py")
    assert over.startswith(f"9_toy.py: {time_plan.prose_words(wordy)} words of prose, over the budget of 1200")
    many = TOY + "".join(f"lab.method_{n}()\n" for n in range(reading_budget.LAB_NAME_BUDGET))
    (tmp_path / "9_toy.py").write_text(many)
    (names,) = reading_budget.over_budget(tmp_path / "9_toy.py")
    assert names.startswith("9_toy.py: 23 lab names, over the budget of 15: ['Lab.connect', 'PerfAnalyzerError'")


@pytest.mark.parametrize("source", time_plan.notebook_sources(), ids=lambda path: path.stem)
def test_each_notebook_keeps_to_its_budgets(source):
    """Issue 50's decision: a lesson's checks are counted apart, and every notebook uses at most 15
    other names of the lab."""
    assert reading_budget.over_budget(source) == []
