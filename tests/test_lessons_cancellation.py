"""Notebook 9's check on streamed work, fed a case it must pass and cases it must fail."""

from servelab.lessons import cancellation
from servelab.lessons.expectations import Outcome
from servelab.results import LatencySummary, RunResult

ASKED, READ = 12, 2


def streamed(left: int, for_gone: int, patient_p50_ms: float, answered: int = 10, interrupted=()) -> RunResult:
    """A streamed run: `left` streams whose client left after READ of ASKED steps, the server's
    count of the steps it computed for them, the patient clients' p50 to their last step."""
    latency = LatencySummary(patient_p50_ms, patient_p50_ms, *(1.2 * patient_p50_ms,) * 3, 1.5 * patient_p50_ms)
    return RunResult(
        "refine", "loadgen", "closed", answered + left, 1.0, latency, 10.0, concurrency=8, cancelled=left,
        impatient=4, patient_latency=latency, latencies_ms=[patient_p50_ms] * answered,
        steps={"asked": ASKED, "leave_after_steps": READ, "computed": 500, "for_gone_clients": for_gone},
        interrupted_by=list(interrupted),
    )  # fmt: skip


def outcomes(expectation) -> list[Outcome]:
    return [part.outcome for part in expectation.conditions]


def test_streams_that_stop_at_the_next_step_hold_and_the_figures_are_the_runs():
    off, on = streamed(20, 190, 900.0), streamed(20, 14, 500.0)
    held = cancellation.stream_stops_at_the_next_step("FastAPI", off, on)
    assert held.outcome is Outcome.HELD
    wasted, left, asked, read = held.conditions[0].figures
    assert (wasted.value, left.value, asked.value, read.value) == (190, 20, ASKED, READ)
    assert held.conditions[0].detail == "9.5 per client who left"
    assert [item.value for item in held.conditions[2].figures] == [500.0, 900.0]


def test_a_server_that_keeps_computing_with_cancellation_on_fails_the_second_condition():
    off, on = streamed(20, 190, 900.0), streamed(20, 150, 500.0)
    assert outcomes(cancellation.stream_stops_at_the_next_step("Ray Serve", off, on)) == [
        Outcome.HELD, Outcome.NOT_HELD, Outcome.HELD,
    ]  # fmt: skip


def test_an_off_run_that_wasted_nothing_and_patients_no_faster_fail_their_conditions():
    off, on = streamed(20, 30, 500.0), streamed(20, 10, 700.0)
    failed = cancellation.stream_stops_at_the_next_step("Triton", off, on)
    assert outcomes(failed) == [Outcome.NOT_HELD, Outcome.HELD, Outcome.NOT_HELD]
    assert failed.outcome is Outcome.NOT_HELD and "completed 10 streams" in str(failed)


def test_a_run_a_crash_interrupted_or_a_missing_run_is_not_checked():
    off, on = streamed(20, 190, 900.0), streamed(20, 14, 500.0, interrupted=["triton exited (signal 11)"])
    interrupted = cancellation.stream_stops_at_the_next_step("Triton", off, on)
    assert outcomes(interrupted) == [Outcome.HELD, Outcome.NOT_CHECKED, Outcome.NOT_CHECKED]
    assert cancellation.stream_stops_at_the_next_step("Triton", None, on).outcome is Outcome.NOT_CHECKED
