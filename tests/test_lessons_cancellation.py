"""Notebook 10's checks, each fed a case it must pass and cases it must fail, the appendix's race
check, and the notebooks' machinery that runs without a server (a stand-in lab)."""

import math
from types import SimpleNamespace

from servelab import retries
from servelab.lessons import cancellation
from servelab.lessons.expectations import Outcome
from servelab.results import LatencySummary, RunResult
from tests.helpers.lessons import outcomes

ASKED, READ = 12, 2


def streamed(left: int, for_gone: int, patient_p50_ms: float, answered: int = 10, interrupted=()) -> RunResult:
    """A streamed run: `left` streams whose client left after READ of ASKED steps, the server's
    count of the steps it computed for them, the patient clients' p50 to their last step."""
    latency = LatencySummary(patient_p50_ms, patient_p50_ms, *(1.2 * patient_p50_ms,) * 3, 1.5 * patient_p50_ms)
    return RunResult(
        "refine",
        "loadgen",
        "closed",
        answered + left,
        1.0,
        latency,
        10.0,
        concurrency=8,
        cancelled=left,
        impatient=4,
        patient_latency=latency,
        latencies_ms=[patient_p50_ms] * answered,
        steps={"asked": ASKED, "leave_after_steps": READ, "computed": 500, "for_gone_clients": for_gone},
        interrupted_by=list(interrupted),
    )


def test_streams_that_stop_at_the_next_step_hold_and_the_figures_are_the_runs():
    off, on = streamed(20, 190, 900.0), streamed(20, 14, 500.0)
    held = cancellation.stream_stops_at_the_next_step("FastAPI", off, on)
    assert held.outcome is Outcome.HELD
    wasted, left, asked, read = held.conditions[0].figures
    assert (wasted.value, left.value, asked.value, read.value) == (190, 20, ASKED, READ)
    assert held.conditions[0].detail == "9.5 per client who left"
    assert held.estimate is not None and (held.estimate.value, held.estimate.unit) == (9.5, "steps")
    assert [item.value for item in held.conditions[2].figures] == [500.0, 900.0]


def test_a_server_that_keeps_computing_with_cancellation_on_fails_the_second_condition():
    off, on = streamed(20, 190, 900.0), streamed(20, 150, 500.0)
    kept_on = cancellation.stream_stops_at_the_next_step("Ray Serve", off, on)
    assert outcomes(kept_on) == [Outcome.HELD, Outcome.NOT_HELD, Outcome.HELD]


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


def test_streams_with_no_client_gone_are_not_checked_rather_than_held_on_zero():
    """Nobody left: "at most 2 steps per client who left" (0 <= 0) and "at least half of the steps
    left behind" (0 >= 0) would hold on nothing."""
    nobody = cancellation.stream_stops_at_the_next_step("FastAPI", streamed(0, 0, 900.0), streamed(0, 0, 880.0))
    assert outcomes(nobody) == [Outcome.NOT_CHECKED] * 3
    said = "no client left with cancellation off: there was nothing to cancel, so nothing to judge"
    assert nobody.conditions[0].detail == said


def request_run(cancelled: int, p95_ms: float, goodput: float, abandoned: int | None = None, **fields) -> RunResult:
    """A run of patient and impatient clients: `cancelled` requests given up, the patient p95 and
    the goodput; `abandoned` what the FastAPI service abandoned before the model."""
    latency = LatencySummary(p95_ms / 2, p95_ms / 2, p95_ms, p95_ms, p95_ms, p95_ms)
    stats = {"abandoned_by_stage": {"slot_wait": abandoned}} if abandoned is not None else None
    return RunResult(
        "x",
        "loadgen",
        "closed",
        100,
        goodput,
        latency,
        10.0,
        concurrency=8,
        cancelled=cancelled,
        impatient=4,
        patient_latency=latency,
        service_stats=stats,
        **fields,
    )


def test_fastapi_without_cancellation_wastes_and_its_patient_clients_pay():
    off, on = request_run(40, 900, 8), request_run(40, 400, 12, abandoned=35)
    wasteful = cancellation.waste_without_cancellation(off, on, 38)
    assert outcomes(wasteful) == [Outcome.HELD] * 3
    assert wasteful.estimate is not None and (wasteful.estimate.value, wasteful.estimate.unit) == (95.0, "%")
    # The wrong outcome: a server that noticed the disconnects on its own (little waste with it off).
    assert outcomes(cancellation.waste_without_cancellation(off, on, 5))[0] is Outcome.NOT_HELD
    # Nobody left: the two runs are the same setting, and their difference is noise.
    quiet = cancellation.waste_without_cancellation(request_run(0, 400, 12), request_run(0, 410, 11.8), 0)
    assert outcomes(quiet) == [Outcome.NOT_CHECKED] * 3
    assert quiet.estimate is not None and math.isnan(quiet.estimate.value)  # no share of nothing cancelled


def test_abandoning_cuts_the_waste_and_abandons_before_the_model():
    off, on = request_run(40, 900, 8), request_run(40, 400, 12, abandoned=35)
    cut = cancellation.abandoning_cuts_the_waste(off, on, 38, 3)
    assert outcomes(cut) == [Outcome.HELD, Outcome.HELD]
    assert cut.estimate is not None and cut.estimate.value == 100 * 3 / 38
    # The wrong outcome: abandoning on, yet the server ran the model for those who left.
    late = request_run(40, 800, 8.5, abandoned=4)
    assert outcomes(cancellation.abandoning_cuts_the_waste(off, late, 38, 30)) == [Outcome.NOT_HELD] * 2
    # 0 < 0 / 4 would read DID NOT HOLD: nothing was wasted, nobody left.
    skipped = cancellation.abandoning_cuts_the_waste(
        request_run(0, 400, 12), request_run(0, 400, 12, abandoned=0), 0, 0
    )
    assert outcomes(skipped) == [Outcome.NOT_CHECKED] * 2
    assert skipped.conditions[0].detail.startswith("nothing was wasted with abandoning off")


def test_triton_cancels_over_grpc_not_over_http():
    http = request_run(40, 900, 8)
    grpc = request_run(40, 400, 12, triton_stats={"fail_count": 20, "cancelled_by_model": 15})
    heard = cancellation.triton_cancels_over_grpc(http, grpc, 36, 4)
    assert outcomes(heard) == [Outcome.HELD] * 3 and heard.estimate is not None and heard.estimate.value == 10.0
    # The wrong outcome: the cancels never reached Triton over gRPC either.
    deaf = request_run(40, 900, 8, triton_stats={"fail_count": 0, "cancelled_by_model": 0})
    unheard = cancellation.triton_cancels_over_grpc(http, deaf, 36, 38)
    assert outcomes(unheard) == [Outcome.HELD, Outcome.NOT_HELD, Outcome.NOT_HELD]
    none_left = request_run(0, 400, 12, triton_stats={"fail_count": 0, "cancelled_by_model": 0})
    unjudged = cancellation.triton_cancels_over_grpc(request_run(0, 400, 12), none_left, 0, 0)
    assert outcomes(unjudged) == [Outcome.NOT_CHECKED] * 3


def test_ray_serve_drops_what_it_can():
    dropped = cancellation.ray_drops_gone_requests(request_run(40, 400, 12), 3)
    assert dropped.outcome is Outcome.HELD and dropped.estimate is not None and dropped.estimate.value == 7.5
    assert cancellation.ray_drops_gone_requests(request_run(40, 900, 8), 30).outcome is Outcome.NOT_HELD
    assert cancellation.ray_drops_gone_requests(request_run(0, 400, 12), 0).outcome is Outcome.NOT_CHECKED


RaceProbe = cancellation.RaceProbe
RACY, FIXED, FIXED_IN = (2, 51, 0), (2, 53, 0), (2, 53)


ALONE = request_run(0, 20, 100)  # the run that measured a request alone: the service-time deadline


def race(lesson: RaceProbe, at_s: RaceProbe, version=RACY):
    return cancellation.triton_cancellation_race(ALONE, lesson, at_s, version, FIXED_IN, probe_s=30, cores=2)


def test_the_race_on_2_51_crashes_at_the_service_time_and_not_at_the_lesson_s_deadline():
    lesson = RaceProbe(60, {"START": 10, "ISSUED": 48, "COMPLETE": 2})  # given up while queued
    at_s = RaceProbe(40, {"ISSUED": 22, "COMPLETE": 12, "FINISH": 6}, "triton exited (signal 11)")
    held = race(lesson, at_s)
    assert outcomes(held) == [Outcome.HELD] * 3
    # The deadline is read from its run, so that the verdict says what the table says.
    assert held.conditions[1].figures[-1].value == ALONE.latency.p50_ms == 10
    assert held.claim == "Triton 2.51.0: cancellations handled as their answer completes race, and crash the server"
    assert held.conditions[0].detail.startswith("+41.7 points, against ")
    assert "this machine's 2 core(s)" in held.reason and "within 30 s" in held.reason
    # On the release with the fix, the same shares and no crash anywhere hold too.
    fixed = race(lesson, RaceProbe(40, at_s.steps), FIXED)
    assert outcomes(fixed) == [Outcome.HELD] * 3 and "no longer crash" in fixed.claim


def test_the_race_fails_where_the_deadlines_reach_the_server_at_the_same_steps_or_the_crashes_are_not_as_said():
    """The wrong outcomes: the service-time deadline brings no more cancellations to the answer's
    completion than the lesson's (a 3-point difference is within the noise of 40 and 60 shares),
    the race missed, and the lesson's own deadline crashed the server."""
    lesson = RaceProbe(60, {"ISSUED": 50, "COMPLETE": 10}, "hung: it stopped answering")
    at_s = RaceProbe(40, {"ISSUED": 32, "COMPLETE": 8})
    assert outcomes(race(lesson, at_s)) == [Outcome.NOT_HELD] * 3
    # A fixed release that crashed all the same fails its second condition.
    crashed = RaceProbe(40, {"ISSUED": 20, "COMPLETE": 20}, "triton exited (signal 11)")
    fixed_crashed = race(RaceProbe(60, {"ISSUED": 60}), crashed, FIXED)
    assert outcomes(fixed_crashed) == [Outcome.HELD, Outcome.NOT_HELD, Outcome.HELD]


def test_the_race_is_not_checked_where_no_client_gave_up():
    """0 cancelled: no share to compare, and "no crash" would hold on nothing."""
    nobody = race(RaceProbe(0), RaceProbe(0))
    assert outcomes(nobody) == [Outcome.NOT_CHECKED] * 3
    assert nobody.conditions[0].detail == (
        "no client gave up at the service time (0 cancelled): there was no cancellation to race"
    )
    assert nobody.conditions[2].detail.startswith("no client gave up at the lesson's deadline (0 cancelled)")
    # Cancellations, but no log to read the steps from: the shares are NOT CHECKED, the crashes judged.
    unlogged = race(RaceProbe(60), RaceProbe(40, {}, "triton exited (signal 11)"))
    assert outcomes(unlogged) == [Outcome.NOT_CHECKED, Outcome.HELD, Outcome.HELD]
    assert unlogged.conditions[0].detail.startswith("the server's log shows none of the 40 cancellations at the")


# ---- the machinery: pacing, waste, tables, and the loads against a stand-in lab -----------------


def test_pacing_gives_up_after_the_service_time_and_offers_half_of_one_slot():
    patience_s, backoff_s = cancellation.pacing(50.0, impatient=4)
    assert patience_s == 0.05
    # Each sender: one request per patience + back-off = 2 s x 4; the four together, one per 2 s.
    assert math.isclose(patience_s + backoff_s, 2 * 4 * 0.05)


def test_wasted_inferences_are_those_beyond_the_answers_never_below_zero_nan_where_unread():
    assert cancellation.wasted_inferences(30, 22) == 8
    assert cancellation.wasted_inferences(20, 22) == 0  # a server counts at a scrape, clients a bit later
    assert math.isnan(cancellation.wasted_inferences(math.nan, 22))
    # Triton counts a request its model answered CANCELLED as a success.
    assert cancellation.inferences_computed({"success_count": 40, "cancelled_by_model": 15}) == 25


def test_the_streams_table_has_a_line_per_run_with_the_steps_per_client_who_left():
    rows = cancellation.stream_rows(
        {("FastAPI", "on"): streamed(0, 0, 500), ("FastAPI", "off"): streamed(20, 190, 900.0)}
    )  # off first, whichever was measured first
    assert len(rows) == 3 and "9.50" in rows[1] and "900 / 1080 ms (10 streams)" in rows[1]
    assert "nan" in rows[2]  # nobody left: no steps per client who left


def test_the_probe_table_says_where_there_was_no_log():
    rows = cancellation.probe_rows(
        {
            "at the service time": RaceProbe(40, {"ISSUED": 30, "FINISH": 10}, "hung"),
            "the lesson's deadline": RaceProbe(60),
        }
    )
    assert "FINISH 10, ISSUED 30" in rows[1] and "25.0%" in rows[1] and rows[1].endswith("hung")
    assert "no log to read" in rows[2] and rows[2].endswith("none")


class StandInLab:
    """The Lab's calls the experiment makes, answered from a list of runs, with no server."""

    def __init__(self, *runs):
        self.runs, self.calls = list(runs), []
        self.triton_http, self.triton_grpc = "127.0.0.1:8000", "127.0.0.1:8001"
        self.profile = SimpleNamespace(duration_s=3.0)
        self.measurer = self  # its closed_loop answers as the Lab's measurer
        self.triton = SimpleNamespace(applied=[])
        self.triton.configs = SimpleNamespace(
            apply_config=lambda model, config: self.triton.applied.append((model, config)),
            restore_config=lambda model: self.triton.applied.append((model, "shipped")),
        )

    def hardware(self) -> str:
        return "2 CPU core(s) and no GPU"

    def closed_loop(self, address, concurrency, duration_s, name, **options):
        self.calls.append((address, concurrency, duration_s, name, options))
        return self.runs.pop(0)


def test_a_request_load_is_paced_from_the_latency_alone_and_its_waste_accounted():
    alone = request_run(0, 40, 50)  # p50 20 ms
    run = request_run(10, 400, 12)
    run.service_stats = {"stage_counts": {"inference": 30}, "abandoned_by_stage": {}}
    run.latencies_ms = [1.0] * 22
    lab = StandInLab(alone, run)
    experiment = cancellation.Experiment(lab, patient=4, impatient=4)
    assert experiment.duration_s == 6  # at least 6 s, whatever the profile
    assert experiment.requests("fastapi_onnx, abandon off", "http://x") is run
    assert lab.calls[0][1:4] == (1, 3, "fastapi_onnx, abandon off, 1 client")  # a request alone, first
    _, concurrency, duration_s, _, options = lab.calls[1]
    assert duration_s == 6 and concurrency == 8 and options["impatient"] == 4 and options["service_stats"]
    assert (options["patience_s"], options["backoff_s"]) == cancellation.pacing(20.0, 4)
    assert experiment.runs == {"fastapi_onnx, abandon off": run} and experiment.wasted["fastapi_onnx, abandon off"] == 8
    lab.profile.duration_s = 2.0  # the quick profile: a request alone is timed for as long as a run, 2 s
    assert cancellation.Experiment(lab).alone_s == 2.0


def test_a_triton_run_that_triton_crashed_under_is_measured_once_more_and_not_twice(capsys, monkeypatch):
    noted = []  # the retry is said (servelab.retries), here kept out of the suite's own list
    monkeypatch.setattr(retries, "note", lambda what, why: noted.append((what, why)))
    stats = {"success_count": 30, "cancelled_by_model": 10, "fail_count": 5}
    crashed = request_run(10, 400, 12, triton_stats=stats, interrupted_by=["triton exited (signal 11)"])
    again = request_run(10, 400, 12, triton_stats=stats)
    lab = StandInLab(request_run(0, 40, 50), crashed, again)
    experiment = cancellation.Experiment(lab)
    with experiment.triton_config("food_classifier_onnx", "one at a time"):
        assert experiment.triton_requests("grpc", "food_classifier_onnx") is again
    assert [call[0] for call in lab.calls] == ["127.0.0.1:8001"] * 3 and lab.calls[1][4]["kind"] == "triton-grpc"
    assert lab.triton.applied == [("food_classifier_onnx", "one at a time"), ("food_classifier_onnx", "shipped")]
    assert "Triton crashed during this run" in capsys.readouterr().out
    assert noted == [("the run 'triton/food_classifier_onnx, grpc'", "Triton crashed under it")]
    # Crashed twice: the second run is kept as it is, marked, for its verdict to be NOT CHECKED.
    lab = StandInLab(request_run(0, 40, 50), crashed, crashed, again)
    assert cancellation.Experiment(lab).triton_requests("http", "food_classifier_onnx") is crashed
    assert lab.runs == [again] and lab.calls[0][0] == "127.0.0.1:8000"
