"""The lessons' checks as the notebooks show them: each condition judged on its own figures, a
figure that remembers its run, a premise that did not arise, the student's prediction beside the
verdict, and a verdict left unchecked without a reason is the lab's own problem. The notebooks'
other helpers: test_lab_helpers.py."""

from __future__ import annotations

import math
import re

import pytest

from servelab.lab import Lab
from servelab.lessons.expectations import (
    Condition,
    Estimate,
    Expectation,
    ExpectationLog,
    LabFault,
    Outcome,
    PredictionError,
    condition,
    figure,
    measured,
    not_checked,
    unless,
    verdict_problems,
)
from servelab.profiles import profile
from tests.helpers.perf_runs import perf_result


def test_each_condition_is_judged_on_its_own_figures_and_a_missing_run_is_not_checked(capsys):
    run = perf_result(queue_us=2000, infer_us=5000)
    queue, infer = figure(run, "server_ms(queue)", "queue"), figure(run, "server_ms(compute_infer)", "compute")
    log = ExpectationLog()
    held = log.record("queueing is short", (condition("the queue is under 5 ms", queue.value < 5, queue),))
    mixed = log.record(
        "compute dominates",
        (
            condition("compute exceeds the queue", infer.value > queue.value, infer, queue, detail="2.5x"),
            condition("compute is under 1 ms", infer.value < 1, infer),
            condition("c=16 queues longer", False, figure(None, "server_ms(queue)", "queue at c=16")),
        ),
        reason="a CPU",
    )
    printed = capsys.readouterr().out
    assert (held.outcome, mixed.outcome) == (Outcome.HELD, Outcome.NOT_HELD)
    assert [part.outcome for part in mixed.conditions] == [Outcome.HELD, Outcome.NOT_HELD, Outcome.NOT_CHECKED]
    assert "  - HELD: compute exceeds the queue: compute 5.00 ms, queue 2.00 ms (2.5x)" in printed
    assert "  - NOT CHECKED: c=16 queues longer: queue at c=16: not measured (not measured: queue at c=16)" in printed
    assert "Why: a CPU" in printed
    assert log.summary().splitlines() == [
        "        HELD: queueing is short",
        "DID NOT HOLD: compute dominates",
        "                HELD: compute exceeds the queue",
        "                DID NOT HOLD: compute is under 1 ms",
        "                NOT CHECKED: c=16 queues longer (not measured: queue at c=16)",
    ]
    assert {item.run for item in log.figures()} == {run.label, None}


def test_a_figure_remembers_the_run_and_field_it_was_read_from():
    run = perf_result()
    run.triton_stats = {"avg_batch_size": 2.5}
    run.resources = {
        "t_s": [0.5, 1.0],
        "cpu_percent": [50.0, 70.0],
        "cpu_per_core": [[50.0], [70.0]],
        "memory_percent": [1, 1],
        "gpus": [],
        "gpu_source": "none",
        "errors": [],
        "processes": {"toy_0_0": 98.5},
    }
    for field, value in [
        ("throughput_rps", 42.0),
        ("latency.p50_ms", 7.5),
        ("server_ms(queue)", 2.0),
        ("triton_stats.avg_batch_size", 2.5),
        ("resources.cpu_percent_mean", 60.0),
        ("resources.processes.toy_0_0", 98.5),
    ]:
        read = figure(run, field, "x")
        assert (read.value, read.run, read.started_at, read.field) == (value, run.label, run.started_at, field)
    assert figure(run, "latency.p50_ms", "x").unit == "ms" and figure(run, "throughput_rps", "x").unit == "req/s"


def test_the_lab_records_every_expectation_for_its_final_list(capsys):
    lab = Lab("local", profile("quick"), {}, None, None, None)
    lab.expect("a", condition("one is more than zero", 1 > 0, measured("one", 1)))
    lab.expect("b", condition("c=16 was measured", True, figure(None, "throughput_rps", "c=16")))
    # The list is printed before its check, which finds no verdict read from a run here (tests/test_notebooks.py).
    with pytest.raises(LabFault, match="no verdict read a number from a run"):
        lab.verdicts()
    assert capsys.readouterr().out.splitlines()[-3:] == [
        "        HELD: a",
        " NOT CHECKED: b",
        "                why: not measured: c=16",
    ]


def test_a_condition_whose_premise_did_not_arise_is_not_checked_with_its_reason(capsys):
    """Nothing cancelled: "the waste is under a quarter of the cancelled" (0 < 0) would read DID NOT
    HOLD, and "at least half were dropped" (0 >= 0) HELD; both are NOT CHECKED, and say why."""
    cancelled, wasted = measured("cancelled", 0), measured("wasted", 0)
    judged = condition(
        "the waste is under a quarter of the cancelled", wasted.value < cancelled.value / 4, wasted, cancelled
    )
    assert judged.outcome is Outcome.NOT_HELD  # judged anyway, the vacuous comparison fails
    skipped = unless(cancelled.value > 0, "no client left during the run", judged)
    assert (skipped.outcome, skipped.detail, skipped.figures) == (
        Outcome.NOT_CHECKED,
        "no client left during the run",
        (wasted, cancelled),
    )
    assert unless(True, "never shown", judged) is judged
    log = ExpectationLog()
    log.record("cancellation saves work", (skipped,))
    assert (
        "  - NOT CHECKED: the waste is under a quarter of the cancelled: wasted 0.00, cancelled 0.00 (no client "
        "left during the run)" in capsys.readouterr().out
    )
    assert log.summary().splitlines()[-1].endswith("why: no client left during the run")
    with pytest.raises(ValueError, match="says why"):
        not_checked("a condition", "")


def test_the_student_s_prediction_is_shown_beside_the_verdict_and_judged_right_or_wrong(capsys):
    held, failed = condition("grows", True, measured("queue", 2.0)), condition("grows", False, measured("queue", 0.0))
    unseen = not_checked("grows", "nothing queued")
    log = ExpectationLog()
    assert log.record("queue grows", (held,), predicted=True).prediction_said() == (
        "You predicted it would hold: right"
    )
    assert log.record("queue grows", (failed,), predicted=True).prediction_said() == (
        "You predicted it would hold: wrong"
    )
    assert log.record("queue grows", (failed,), predicted=False).prediction_said() == (
        "You predicted it would not hold: right"
    )
    assert "neither right nor wrong" in log.record("queue grows", (unseen,), predicted=False).prediction_said()
    assert log.record("queue grows", (held,), predicted="  ").prediction_said() == "Your prediction: (none written)"
    words = log.record("queue grows", (held,), predicted="it doubles").prediction_said()
    assert words == "Your prediction: it doubles" and log.record("queue grows", (held,)).prediction_said() == ""
    printed = capsys.readouterr().out
    assert "  You predicted it would hold: wrong" in printed and "Your prediction: it doubles" in printed
    assert "    You predicted it would not hold: right" in log.summary()


def test_a_number_predicted_is_shown_with_the_number_measured_and_the_error_and_an_empty_one_is_said():
    held = condition("rises", True, measured("rate", 2.0))
    speedup = Estimate("the speedup of 4 instances over 1", 1.84, "x")
    log = ExpectationLog()
    said = log.record("instances help", (held,), predicted=3, estimate=speedup).prediction_said()
    assert said == "You predicted the speedup of 4 instances over 1: x3; measured x1.84: off by +63%"
    latency = Estimate("the mean latency at c=16", 250.0, "ms")
    said = log.record("queue grows", (held,), predicted=200.0, estimate=latency).prediction_said()
    assert said == "You predicted the mean latency at c=16: 200 ms; measured 250 ms: off by -20%"
    missing = Estimate("the speedup", math.nan, "x")
    assert "not measured here" in log.record("x", (held,), predicted=2.0, estimate=missing).prediction_said()
    assert log.record("instances help", (held,), predicted=None, estimate=speedup).prediction_said() == (
        "No prediction made."
    )
    assert "No prediction made." in log.summary()
    recorded = len(log)
    with pytest.raises(PredictionError, match="this check measures no number to compare 2.0 with: type True") as slip:
        log.record("queue grows", (held,), predicted=2.0)
    assert len(log) == recorded, "nothing of a refused prediction is kept"
    assert isinstance(slip.value, ValueError) and not isinstance(slip.value, LabFault), "the student's slip"
    assert slip.value._render_traceback_()[0].startswith("Your prediction for 'queue grows' was not recorded")


@pytest.mark.parametrize(
    ("predicted", "estimate", "said"),
    [
        (2, None, "measures no number to compare 2 with: type True if you expect it to hold, False if not"),
        (
            [2.0],
            Estimate("the speedup", 1.5, "x"),
            "[2.0] is not a number it can compare: type a number, the speedup (a ratio, such as 1.5); or True",
        ),
        (float("nan"), Estimate("the queue at c=16", 20.0, "ms"), "type a number, the queue at c=16, in ms"),
    ],
)
def test_a_prediction_in_a_form_its_check_cannot_judge_says_which_form_to_type(predicted, estimate, said):
    log = ExpectationLog()
    with pytest.raises(PredictionError, match=re.escape(said)):
        log.record(
            "a claim", (condition("rises", True, measured("rate", 2.0)),), predicted=predicted, estimate=estimate
        )
    assert log == []


def test_a_verdict_not_checked_without_a_reason_is_a_problem_of_the_lab():
    run = perf_result()
    log = ExpectationLog()
    log.append(
        Expectation(
            "x",
            (
                condition("read", True, figure(run, "throughput_rps", "rate")),
                Condition("silent", Outcome.NOT_CHECKED, ()),
            ),
        )
    )
    assert verdict_problems(log, [run], [run]) == [
        "'x': 'silent' is NOT CHECKED without saying why (a check builds it with `not_checked` and the reason its "
        "premise did not arise)"
    ]
    log[-1] = Expectation("x", (log[-1].conditions[0], not_checked("said", "nothing queued")))
    assert verdict_problems(log, [run], [run]) == []
