"""How the notebooks are checked. nbmake runs each one, as a student runs it, against the session's
servers (the root conftest.py and tests/lab_servers.py). A judging notebook checks its own verdicts in
its last cells: `lab.verdicts()` raises a LabFault where its saved runs and its table differ, or a claim
that must hold did not. These tests check that check, and that nbmake reports a failing notebook by
its cell and its error, within its time limit.
"""

from __future__ import annotations

import dataclasses
import subprocess
import time

import nbformat
import pytest

from servelab.lab import Lab, run_keeper
from servelab.lab.notebook_runs import NOTEBOOKS, judging
from servelab.lessons.expectations import Expectation, LabFault, PredictionError, condition, figure, measured
from servelab.profiles import profile
from tests.helpers import own_session, synthetic_run


def judging_lab(tmp_path, monkeypatch) -> Lab:
    monkeypatch.setattr(run_keeper, "SAVED_RUNS_DIR", tmp_path / "results")
    return Lab("local", profile("quick"), {}, None, None, None, notebook="toy")


def test_a_clean_notebook_s_verdicts_pass(tmp_path, monkeypatch):
    lab = judging_lab(tmp_path, monkeypatch)
    slow = lab.keeper.keep(synthetic_run("fastapi_pt", throughput_rps=10.0), "fastapi_pt", time.time())
    fast = lab.keeper.keep(synthetic_run("fastapi_onnx", throughput_rps=20.0), "fastapi_onnx", time.time())
    pt, onnx = figure(slow, "throughput_rps", "PyTorch"), figure(fast, "throughput_rps", "ONNX")
    lab.expect("ONNX is faster", condition("more requests per second", onnx.value > pt.value, pt, onnx))
    lab.expect("two nodes", condition("two", True, measured("nodes", 2)), must_hold=True)
    assert "HELD: ONNX is faster" in lab.verdicts()


def test_a_prediction_typed_in_the_wrong_form_then_fixed_leaves_the_verdicts_clean(tmp_path, monkeypatch):
    """A number where the check measures none is the student's slip: refused with the form to type,
    nothing of it kept; the cell run again with the fixed prediction records the verdict once."""
    lab = judging_lab(tmp_path, monkeypatch)
    run = lab.keeper.keep(synthetic_run("fastapi_pt", throughput_rps=10.0), "fastapi_pt", time.time())
    judged = Expectation("it serves", (condition("some requests", True, figure(run, "throughput_rps", "rate")),))
    with pytest.raises(PredictionError, match="type True if you expect it to hold, False if not") as slip:
        lab.record(judged, predicted=2.0)
    assert not isinstance(slip.value, LabFault)
    assert list(lab.expectations) == [], "the refused prediction is kept nowhere"
    lab.record(judged, predicted=True)
    summary = lab.verdicts()
    assert summary.count("HELD: it serves") == 1 and "You predicted it would hold: right" in summary


def test_a_verdict_whose_figure_is_not_in_its_table_raises(tmp_path, monkeypatch):
    lab = judging_lab(tmp_path, monkeypatch)
    shown = lab.keeper.keep(synthetic_run("fastapi_pt"), "fastapi_pt", time.time())
    elsewhere = synthetic_run("fastapi_onnx", throughput_rps=99.0)  # measured, never kept by this lab
    lab.expect("a claim", condition("read from its table", True, figure(shown, "throughput_rps", "shown")))
    lab.expect("another", condition("read from elsewhere", True, figure(elsewhere, "throughput_rps", "unseen")))
    with pytest.raises(LabFault, match=r"toy: 1 problem\(s\)") as raised:
        lab.verdicts()
    assert "a verdict used unseen of fastapi_onnx [loadgen, c=1], which is not in its table" in str(raised.value)


def test_a_verdict_whose_figure_differs_from_its_saved_run_raises(tmp_path, monkeypatch):
    lab = judging_lab(tmp_path, monkeypatch)
    kept = lab.keeper.keep(synthetic_run("fastapi_pt", throughput_rps=10.0), "fastapi_pt", time.time())
    misread = dataclasses.replace(figure(kept, "throughput_rps", "throughput"), value=12.0)
    lab.expect("a claim", condition("judged on 12", True, misread))
    with pytest.raises(LabFault, match=r"toy: 1 problem\(s\)") as raised:
        lab.verdicts()
    assert "- throughput is 12.0 in a verdict but 10.0 in its saved run" in str(raised.value)


def test_a_run_in_its_table_that_was_never_saved_raises(tmp_path, monkeypatch):
    lab = judging_lab(tmp_path, monkeypatch)
    kept = lab.keeper.keep(synthetic_run("fastapi_pt"), "fastapi_pt", time.time())
    lab.results.append(synthetic_run("fastapi_onnx"))  # in the table, never saved
    lab.expect("a claim", condition("read from its table", True, figure(kept, "throughput_rps", "throughput")))
    with pytest.raises(LabFault) as raised:
        lab.verdicts()
    assert "- the saved runs are not those of its table" in str(raised.value)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("triton_stats", {"avg_batch_size": 2.5, "executions_by_batch_size": {1: 2, 4: 3}}),
        ("service_stats", {"stage_mean_ms": {"inference": 20.0, "download": float("nan")}}),
        ("resources", {"cpu_percent": [50.0, 75.0]}),
        ("command", ["perf_analyzer", "-m", "food_classifier"]),
    ],
)
def test_a_figure_set_on_a_run_after_the_lab_saved_it_raises(tmp_path, monkeypatch, field, value):
    """The notebooks' order before issue 39: the lab saved the run, then the notebook set the
    figures it had counted over it, which the saved run lacks, whether a verdict reads them or not."""
    lab = judging_lab(tmp_path, monkeypatch)
    run = lab.keeper.keep(synthetic_run("triton/food_classifier_onnx"), "triton/food_classifier_onnx", time.time())
    setattr(run, field, value)
    lab.expect("a claim", condition("read from its table", True, figure(run, "throughput_rps", "throughput")))
    with pytest.raises(LabFault, match=r"toy: 1 problem\(s\)") as raised:
        lab.verdicts()
    assert (
        f"- the saved run of triton/food_classifier_onnx [loadgen, c=1] differs from its table's in {field}: "
        "a figure was set on the run after the lab saved it"
    ) in str(raised.value)


def test_a_run_saved_whole_passes_though_json_made_its_keys_strings_and_nan_equals_nothing(tmp_path, monkeypatch):
    lab = judging_lab(tmp_path, monkeypatch)
    run = synthetic_run(
        "triton/food_sequence", triton_stats={"avg_queue_us": float("nan"), "executions_by_batch_size": {1: 2, 10: 3}}
    )
    kept = lab.keeper.keep(run, "triton/food_sequence", time.time())
    executions = figure(kept, "triton_stats.executions_by_batch_size.10", "executions of 10")
    lab.expect("batches of 10 ran", condition("some", executions.value > 0, executions))
    assert "HELD: batches of 10 ran" in lab.verdicts()


def test_a_notebook_with_no_expectation_raises(tmp_path, monkeypatch):
    # One with no verdict read from a run: tests/test_lab_checks.py.
    with pytest.raises(LabFault, match="no expectation was recorded"):
        judging_lab(tmp_path, monkeypatch).verdicts()


@pytest.mark.parametrize("held", [False, None], ids=["did not hold", "not checked"])
def test_an_expectation_that_must_hold_and_did_not_raises_as_a_fault_of_the_lab(tmp_path, monkeypatch, held):
    lab = judging_lab(tmp_path, monkeypatch)
    run = lab.keeper.keep(synthetic_run("ray_serve"), "ray_serve", time.time())
    lab.expect("speed", condition("fast", False, figure(run, "throughput_rps", "throughput")))  # may not hold
    nodes = measured("nodes", float("nan") if held is None else 1)
    lab.expect("Serve spreads the replicas", condition("two nodes", bool(held), nodes), must_hold=True)
    with pytest.raises(LabFault) as raised:
        lab.verdicts()
    outcome = "NOT CHECKED" if held is None else "DID NOT HOLD"
    assert f"- 'Serve spreads the replicas' {outcome}, and it must hold: it is a claim about what the lab's" in str(
        raised.value
    )
    assert "toy: 1 problem(s)" in str(raised.value), "a speed claim that did not hold is no fault of the lab"
    assert "a fault of the lab" in str(raised.value)


def test_the_notebooks_that_judge_expectations_are_found_and_each_is_generated():
    # The lab's judging lessons as of this writing; a new one joins the list by itself.
    assert {
        "4_fastapi_bench",
        "6_triton_bench",
        "7_triton_batching",
        "8_io_vs_compute",
        "9_concurrency_target",
        "10_cancellation",
        "11_stateful_sequences",
        "appendix_triton_crash",
    } <= {name.removesuffix(".ipynb") for name in judging()}
    for name in judging():
        assert (NOTEBOOKS / name).is_file(), f"{name} is not generated: run `make notebooks`"


# ---- a failing notebook under nbmake ------------------------------------------------------------


def notebook(path, *cells: str, cell_timeout_s: int = 60, notebook_timeout_s: int = 60) -> None:
    """A notebook of `cells` with the time limits scripts/build_notebooks.py writes into the lab's."""
    written = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source) for source in cells])
    written.metadata["kernelspec"] = {"display_name": "Python 3", "language": "python", "name": "python3"}
    written.metadata["execution"] = {"timeout": cell_timeout_s}
    written.metadata["servelab"] = {"notebook_timeout_s": notebook_timeout_s}
    nbformat.write(written, path)


def nbmake(folder, *notebooks: str, timeout_s: float = 120) -> tuple[subprocess.CompletedProcess, float]:
    """`pytest --nbmake` on notebooks in `folder`, as a session of its own; its output and duration."""
    started = time.monotonic()
    run = own_session.pytest_in(folder, "--nbmake", "-ra", *notebooks, timeout_s=timeout_s)
    return run, time.monotonic() - started


def test_a_failing_cell_or_one_past_its_limit_fails_its_notebook_and_so_does_a_notebook_past_its_own(tmp_path):
    notebook(tmp_path / "fails.ipynb", "x = 1", "ratio = x / 0  # the failing cell", "print('never run')")
    notebook(tmp_path / "slow_cell.ipynb", "import time", "time.sleep(600)", cell_timeout_s=3)
    # Each cell within its limit, the whole past the notebook's: the root conftest.py's timeout marker.
    notebook(tmp_path / "slow_notebook.ipynb", "import time", "time.sleep(600)", notebook_timeout_s=5)
    run, took = nbmake(tmp_path, "fails.ipynb", "slow_cell.ipynb", "slow_notebook.ipynb")
    assert run.returncode == 1 and "3 failed" in run.stdout, run.stdout
    assert "ratio = x / 0  # the failing cell" in run.stdout and "ZeroDivisionError" in run.stdout
    assert "time.sleep(600)" in run.stdout and "A cell timed out while it was being executed, after 3 seconds" in (
        run.stdout
    )
    assert "Timeout (>5.0s) from pytest-timeout. The notebook ran past its whole-notebook limit" in run.stdout
    assert took < 90, f"the notebooks took {took:.0f} s, past their limits of 3 s and 5 s"


def test_a_notebook_s_retries_are_listed_with_the_suite_s(tmp_path):
    notebook(tmp_path / "retries.ipynb", "from servelab import retries\nretries.note('the toy start', 'a clash')")
    run, _ = nbmake(tmp_path, "retries.ipynb")
    assert run.returncode == 0, run.stdout
    assert "retries: 1" in run.stdout
    assert "retries.ipynb::retries.ipynb: RETRY the toy start, after: a clash" in run.stdout


# A whole-notebook limit counts the notebook's setup, and the first notebook's starts the session's
# servers (the image host, both services, Triton): over a minute on a busy 2-core machine, where
# the cells take a second. So these notebooks get the time the start may take (Triton's readiness
# limit, 240 s, in servelab/stack/catalogue.py) and a minute for the rest; a hang is still caught,
# in the start by each server's own readiness limit and in a cell by the notebook's.
SERVERS_START_S = 240
WITH_SERVERS_LIMIT_S = SERVERS_START_S + 60


@pytest.mark.integration
@pytest.mark.timeout(3 * WITH_SERVERS_LIMIT_S)  # the nbmake run's limit below, and its own teardown
def test_a_notebook_gets_the_session_s_servers_and_one_that_changes_one_is_caught_and_it_is_put_back(tmp_path):
    config = "(paths.TRITON_DIR / 'models' / 'food_classifier_onnx' / 'config.pbtxt')"
    notebook(
        tmp_path / "a_finds.ipynb",  # `Lab.connect(` in its source is what asks for the servers
        "# Lab.connect()\nimport os\nassert 'SERVELAB_PORT_TRITON_HTTP' in os.environ, 'no server exported'",
        notebook_timeout_s=WITH_SERVERS_LIMIT_S,
    )
    notebook(
        tmp_path / "b_changes.ipynb",
        f"# Lab.connect()\nfrom servelab import paths\n{config}.write_text({config}.read_text() + '# changed')",
        notebook_timeout_s=WITH_SERVERS_LIMIT_S,
    )
    notebook(  # its setup puts Triton's model back: a load, slow too on a busy machine
        tmp_path / "c_after.ipynb",
        f"# Lab.connect()\nfrom servelab import paths\nassert '# changed' not in {config}.read_text()",
        notebook_timeout_s=WITH_SERVERS_LIMIT_S,
    )
    notebooks = ("a_finds.ipynb", "b_changes.ipynb", "c_after.ipynb")
    run, _ = nbmake(tmp_path, *notebooks, timeout_s=3 * WITH_SERVERS_LIMIT_S - 60)  # a minute left to stop
    assert "3 passed, 1 error" in run.stdout, run.stdout  # b_changes ran, and left a server changed
    assert "ERROR b_changes.ipynb::b_changes.ipynb" in run.stdout
    assert "the notebook left Triton's food_classifier_onnx changed" in run.stdout
    assert "RETRY loading food_classifier_onnx as it was served before b_changes.ipynb" in run.stdout
