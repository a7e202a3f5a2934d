"""The helpers every notebook shares: lesson checks, perf_analyzer retries, the breakdown table,
reading GourmetGram's result page. Servers are real; only the retry test replaces perf_analyzer."""

from __future__ import annotations

import re

import pytest

from servelab import perf_analyzer, plots, ui
from servelab.expectations import ExpectationLog, Outcome
from servelab.food11 import LABELS
from servelab.lab import Lab
from servelab.profiles import PROFILES, profile
from servelab.results import LatencySummary, RunResult
from tests.conftest import make_image_bytes


def perf_result(queue_us: float = 2000.0, infer_us: float = 5000.0) -> RunResult:
    return RunResult(
        target="triton/toy (http)",
        tool="perf_analyzer",
        mode="closed",
        requests=10,
        throughput_rps=42.0,
        latency=LatencySummary(8.0, 7.5, 9.0, 9.5, 9.9, 9.9),
        wall_s=0.25,
        concurrency=2,
        server_breakdown={"server_queue_us": queue_us, "server_compute_infer_us": infer_us},
    )


def test_expectations_record_held_not_held_and_not_checked_and_list_them(capsys):
    log = ExpectationLog()
    log.judge("queues grow", held=True, evidence="1 -> 9 ms")
    log.judge("batching helps", held=False, evidence="2.1x vs 2.0x", reason="a CPU has no idle parallelism")
    log.not_checked("more instances stop helping", "no stable measurement for 8 instances")
    printed = capsys.readouterr().out
    assert "-> HELD on this machine: 1 -> 9 ms" in printed
    assert "-> DID NOT HOLD on this machine: 2.1x vs 2.0x\n  Why: a CPU has no idle parallelism" in printed
    assert "-> NOT CHECKED: no stable measurement for 8 instances" in printed
    assert [item.outcome for item in log] == [Outcome.HELD, Outcome.NOT_HELD, Outcome.NOT_CHECKED]
    assert log.summary().splitlines() == [
        "        HELD: queues grow",
        "DID NOT HOLD: batching helps",
        " NOT CHECKED: more instances stop helping",
    ]


def test_the_lab_records_a_claim_it_could_not_check_in_its_verdict_list(tmp_path, capsys):
    lab = Lab("local", profile("quick"), {}, None, None, None)
    lab.expect("a", held=1 > 0, evidence="1 > 0")
    lab.not_checked("b", ["c=16", "c=8"])
    assert lab.verdicts().splitlines() == ["        HELD: a", " NOT CHECKED: b"]
    assert "no stable measurement for c=16, c=8" in capsys.readouterr().out


def test_profiles_are_defined_once_and_an_unknown_one_is_refused(monkeypatch):
    assert profile("quick") is PROFILES["quick"] and profile("full").duration_s > profile("quick").duration_s
    monkeypatch.setenv("LAB_PROFILE", "fast")
    with pytest.raises(ValueError, match="LAB_PROFILE='fast'.*full, quick"):
        profile()


def test_the_breakdown_table_shows_each_stage_in_ms_and_says_when_a_run_gave_no_number():
    table = plots.breakdown_table({"c=1": perf_result(2000, 5000), "c=16": None})
    header, first, missing = table.splitlines()
    assert "queue ms" in header and "compute infer ms" in header
    assert re.search(r"c=1 \|\s+42\.0 \|\s+8\.0 \|\s+9\.5 \|\s+2\.0 \|\s+5\.0$", first)
    assert missing.strip() == "c=16 | no stable measurement"
    with pytest.raises(ValueError, match="only perf_analyzer runs"):
        RunResult("fastapi", "loadgen", "closed", 1, 1.0, LatencySummary.of([1.0]), 1.0).server_ms("queue")


def test_measure_retries_an_unstable_measurement_and_gives_none_when_it_never_settles(monkeypatch, capsys):
    lab = Lab("local", profile("quick"), {}, "127.0.0.1:1", "127.0.0.1:2", None)
    outcomes = [perf_analyzer.NoStableMeasurement("the windows never agreed", ""), perf_result()]

    def perf(model, **load):
        outcome = outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    monkeypatch.setattr(lab, "perf", perf)
    monkeypatch.setattr(lab, "served_instances", lambda model: 2)
    measured = lab.measure("toy", concurrency=2)
    assert measured.target.endswith(", 2 instances")
    assert "the windows never agreed (attempt 1 of 2)" in capsys.readouterr().out
    outcomes[:] = [perf_analyzer.NoStableMeasurement("no request completed", "")] * 2
    assert lab.measure("toy", concurrency=2) is None
    assert "gave up every time, so this run has no result" in capsys.readouterr().out


def test_perf_analyzer_that_never_settles_raises_the_typed_error(triton_http_url):
    with pytest.raises(perf_analyzer.NoStableMeasurement) as raised:
        perf_analyzer.run(
            triton_http_url,
            "food_classifier_onnx",
            concurrency=2,
            measurement_interval_ms=200,
            stability_percentage=0.001,
            max_trials=3,
        )
    assert raised.value.meaning == "the windows never agreed within the stability percentage"


def test_a_result_page_is_read_as_a_browser_shows_it(start_gourmetgram):
    url = start_gourmetgram("fastapi_onnx")
    answer = ui.upload(url, "lunch.jpg", make_image_bytes(7))
    assert answer.status == 200 and answer.label in LABELS and answer.error is None
    assert re.fullmatch(r"\d+\.\d% probability", answer.probability)
    assert answer.answered_by.startswith("answered by fastapi in ")
    refused = ui.upload(url, "notes.jpg", b"not an image")
    assert (refused.status, refused.label, refused.heading) == (400, None, "That is not an image we can read")
    assert "JPEG or PNG" in refused.error
    with pytest.raises(RuntimeError, match="answered HTTP 400"):
        Lab.upload_to_ui(url, "notes.jpg", b"not an image")
