"""Nothing measured is lost, and a crash is never a clean run: the append-only files of runs and
service exits, and how Lab marks, saves and reloads a notebook's runs, each saved whole, with what
the lab counted over it."""

from __future__ import annotations

import dataclasses
import logging
import math
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from servelab import jsonl, loadgen, paths, service_exits
from servelab.lab import Lab, run_keeper
from servelab.lab.triton_side import ServiceCrashed
from servelab.lessons.expectations import Outcome, condition, figure
from servelab.measure import service_stats
from servelab.measure.resources import ResourceSampler
from servelab.profiles import profile
from servelab.report.summaries import summary_line
from servelab.results import LatencySummary, RunResult, SequenceRunResult, append_result, load_appended, saved_fields
from servelab.service_exits import ServiceExit
from servelab.triton import perf_analyzer
from servelab.triton import stats as triton_stats


def run(name: str = "fastapi_onnx", rps: float = 50.0) -> RunResult:
    return RunResult(name, "loadgen", "closed", 100, rps, LatencySummary.of([10.0, 20.0]), 2.0, concurrency=4)


def sequence_run(name: str, length: int, completed: int, **fields) -> SequenceRunResult:
    """A run of 2 sequences of `length` frames in 2 s, each frame answered in 5 ms."""
    fields.update(concurrency=2, sequence_length=length, sequences=2, sequences_completed=completed)
    frames, wall_s, latency = 2 * length, 2.0, LatencySummary.of([5.0])
    return SequenceRunResult(name, "loadgen", "sequences", frames, frames / wall_s, latency, wall_s, **fields)


def local_lab(tmp_path, monkeypatch, exits_file=None, triton_http=None, triton_grpc=None) -> Lab:
    monkeypatch.setattr(run_keeper, "SAVED_RUNS_DIR", tmp_path / "results")
    return Lab(
        "local", profile("quick"), {}, triton_http, triton_grpc, None, notebook="toy", shared_exits_file=exits_file
    )


def test_a_run_saved_when_its_name_was_called_target_loads_with_its_name(tmp_path):
    saved = run("fastapi_onnx, 4 clients")
    old = {key: value for key, value in saved.to_dict().items() if key != "name"} | {"target": saved.name}
    jsonl.append(tmp_path / "old.jsonl", {"metadata": {"notebook": "toy"}, "result": old})
    [(loaded, metadata)] = load_appended(tmp_path / "old.jsonl")
    assert loaded.name == "fastapi_onnx, 4 clients" and saved_fields(loaded) == saved_fields(saved)
    assert metadata == {"notebook": "toy"} and "target" not in loaded.to_dict()


def test_a_process_killed_while_it_appends_leaves_every_record_whole(tmp_path):
    path = tmp_path / "runs.jsonl"
    writer = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(paths.REPO_ROOT)!r})
        from pathlib import Path
        from servelab import jsonl
        n = 0
        while True:
            n += 1
            jsonl.append(Path({str(path)!r}), {{"n": n, "latencies_ms": [float(i) for i in range(20000)]}})
        """
    )
    for _ in range(3):
        process = subprocess.Popen([sys.executable, "-c", writer])
        deadline = time.monotonic() + 30
        while (not path.exists() or path.stat().st_size < 1_000_000) and time.monotonic() < deadline:
            time.sleep(0.05)
        process.send_signal(signal.SIGKILL)
        process.wait()
    records = jsonl.read(path)
    assert len(records) >= 3
    assert all(record["latencies_ms"][-1] == 19999.0 for record in records), "a record was cut short"
    # A record cut short by its writer's kill stays alone on its line: the next writer's first record
    # starts a line of its own, and is whole.
    cut_short = [line for line in path.read_text().splitlines() if line.count('{"n":') != 1 or not line.endswith("}")]
    assert all(line.count('{"n":') == 1 for line in cut_short) and len(cut_short) <= 3, cut_short


def test_a_line_cut_short_is_skipped_with_a_warning_and_the_next_record_starts_a_line_of_its_own(tmp_path, caplog):
    path = tmp_path / "deep" / "runs.jsonl"
    jsonl.append(path, {"n": 1})
    with path.open("a") as file:
        file.write('{"n": 2, "cut sho')  # a writer killed in the middle of its record
    jsonl.append(path, {"n": 3})
    with caplog.at_level(logging.WARNING):
        assert jsonl.read(path) == [{"n": 1}, {"n": 3}]
    assert "line 2 is not a whole record" in caplog.text
    assert jsonl.read(tmp_path / "missing.jsonl") == []


def test_a_run_and_a_run_of_sequences_come_back_from_the_file_as_they_were_saved(tmp_path):
    plain = run()
    plain.interrupted_by = ["triton was killed by signal 11 (SIGSEGV) at 12:00:00; restarted, back 9 s later"]
    sequences = sequence_run("triton/food_sequence", 20, 2)
    path = tmp_path / "runs.jsonl"
    append_result(path, plain, {"session": "s1"})
    append_result(path, sequences, {"session": "s1"})
    (first, first_meta), (second, _) = load_appended(path)
    assert first.to_dict() == plain.to_dict() and first_meta == {"session": "s1"} and not first.clean
    assert isinstance(second, SequenceRunResult) and second.to_dict() == sequences.to_dict()


def test_each_run_is_saved_as_it_ends_and_a_later_session_loads_them_back(tmp_path, monkeypatch, capsys):
    morning = local_lab(tmp_path, monkeypatch)
    morning.keeper.keep(run("fastapi_pt"), "fastapi_pt", time.time())
    morning.keeper.keep(run("fastapi_onnx"), "fastapi_onnx", time.time())
    saved = tmp_path / "results" / "toy.jsonl"
    assert [metadata["notebook"] for _, metadata in load_appended(saved)] == ["toy", "toy"]
    afternoon = local_lab(tmp_path, monkeypatch)
    later = afternoon.keeper.connected_at.replace(year=afternoon.keeper.connected_at.year + 1)
    afternoon.keeper.connected_at = later  # a later session
    afternoon.keeper.keep(run("ray_serve"), "ray_serve", time.time())
    capsys.readouterr()
    assert [result.name for result in Lab.saved_runs("toy")] == ["ray_serve"]
    said = capsys.readouterr().out
    assert "1 saved run(s) of toy" in said and "(2 session(s) in" in said
    assert [result.name for result in Lab.saved_runs("toy", session="all")] == [
        "fastapi_pt",
        "fastapi_onnx",
        "ray_serve",
    ]
    only_morning = Lab.saved_runs("toy", session=morning.keeper.session)
    assert [result.name for result in only_morning] == ["fastapi_pt", "fastapi_onnx"]
    assert Lab.saved_runs("never_run") == []
    known = re.escape(morning.keeper.session)
    with pytest.raises(ValueError, match=f"no session 'yesterday'.*'latest', 'all' or one of {known}"):
        Lab.saved_runs("toy", session="yesterday")


def test_a_run_a_crash_interrupted_is_marked_saved_as_such_and_its_figures_judge_nothing(tmp_path, monkeypatch, capsys):
    exits_file = tmp_path / "restarts.jsonl"
    lab = local_lab(tmp_path, monkeypatch, exits_file)
    started = time.time()
    before = ServiceExit("triton", started - 3600, "was killed by signal 11 (SIGSEGV)", "", "back", started - 3590)
    service_exits.record(exits_file, before)  # before this Lab connected: not this notebook's
    crash = ServiceExit("triton", time.time(), "was killed by signal 11 (SIGSEGV)", "Signal (11) received.")
    service_exits.record(exits_file, crash)
    crash.outcome, crash.back_at = service_exits.BACK, time.time() + 1
    service_exits.record(exits_file, crash)
    crashed = lab.keeper.keep(run(), "triton/food_classifier_onnx, grpc", started)
    assert crashed.interrupted_by == [crash.describe()] and not crashed.clean
    assert "triton was killed by signal 11 (SIGSEGV)" in crashed.interrupted_by[0]
    printed = capsys.readouterr().out
    assert "NOT A CLEAN RUN: triton was killed by signal 11" in printed and "NOTE: triton was killed" in printed
    ((saved, _),) = load_appended(tmp_path / "results" / "toy.jsonl")
    assert saved.interrupted_by == crashed.interrupted_by
    clean = lab.keeper.keep(run(), "fastapi_onnx", time.time() + 5)
    assert clean.clean and "NOT A CLEAN RUN" not in summary_line(clean)
    judged = condition("crashed run", True, figure(crashed, "throughput_rps", "goodput"))
    assert judged.outcome is Outcome.NOT_CHECKED and "crashed during the run of goodput" in judged.detail
    assert condition("clean run", True, figure(clean, "throughput_rps", "goodput")).outcome is Outcome.HELD


def test_a_measurement_waits_for_a_service_being_restarted_and_says_so(tmp_path, monkeypatch, capsys):
    exits_file = tmp_path / "restarts.jsonl"
    lab = local_lab(tmp_path, monkeypatch, exits_file)
    crash = ServiceExit("fastapi_onnx", time.time(), "exited with code 1", "Traceback ...")
    service_exits.record(exits_file, crash)

    def comes_back() -> None:  # as the supervisor of `make up` records it, from another process
        time.sleep(1.0)
        crash.outcome, crash.back_at = service_exits.BACK, time.time()
        service_exits.record(exits_file, crash)

    supervisor = threading.Thread(target=comes_back)
    supervisor.start()
    lab.keeper.wait_for_services()
    assert crash.back_at is not None, "it returned before the service was back"
    supervisor.join()
    printed = capsys.readouterr().out
    assert "NOTE: fastapi_onnx exited with code 1" in printed and "being restarted" in printed
    assert "restarted, back" in printed


def test_a_service_given_up_on_is_said_once_and_measuring_goes_on(tmp_path, monkeypatch, capsys):
    exits_file = tmp_path / "restarts.jsonl"
    lab = local_lab(tmp_path, monkeypatch, exits_file)
    service_exits.record(
        exits_file, ServiceExit("triton", time.time(), "exited with code 1", "", "given up", None, "why")
    )
    lab.keeper.wait_for_services()
    lab.keeper.wait_for_services()
    assert capsys.readouterr().out.count("not restarted: why") == 1


def test_perf_analyzer_failing_under_a_crash_is_said_so_and_measured_again(tmp_path, monkeypatch, capsys):
    exits_file = tmp_path / "restarts.jsonl"
    lab = local_lab(tmp_path, monkeypatch, exits_file, triton_http="127.0.0.1:1")

    class Model:
        def perf_analyzer_input(self, image, folder):
            return {}

    monkeypatch.setattr(lab.triton.configs, "models", {"toy": Model()})

    def dies(*args, **kwargs):
        crash = ServiceExit("triton", time.time(), "was killed by signal 11 (SIGSEGV)", "", "back", time.time())
        service_exits.record(exits_file, crash)
        raise perf_analyzer.PerfAnalyzerError("Failed to retrieve results from inference request.")

    monkeypatch.setattr(perf_analyzer, "run", dies)
    with pytest.raises(ServiceCrashed, match="perf_analyzer failed because triton was killed by signal 11"):
        lab.triton.run_perf_analyzer("toy", time.time())
    monkeypatch.setattr(perf_analyzer, "run", fails)
    with pytest.raises(perf_analyzer.PerfAnalyzerError) as raised:  # no crash since: the tool's own error
        lab.triton.run_perf_analyzer("toy", time.time() + 1)
    assert not isinstance(raised.value, ServiceCrashed)

    outcomes = [ServiceCrashed("perf_analyzer failed because triton was killed by signal 11 (SIGSEGV)"), run("toy")]

    def perf(model, started, **load):
        outcome = outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    monkeypatch.setattr(lab.triton, "run_perf_analyzer", perf)
    monkeypatch.setattr(lab.triton.configs, "served_instances", lambda model: 1)
    monkeypatch.setattr(lab.triton.configs, "served_config", lambda model: 'name: "toy"\n')
    measured = lab.triton.perf("toy", concurrency=1)
    assert measured is not None and measured.name == "toy, 1 instance"
    assert "because triton was killed by signal 11 (SIGSEGV) (attempt 1 of 2)" in capsys.readouterr().out


def fails(*args, **kwargs):
    raise perf_analyzer.PerfAnalyzerError("error: failed to get model metadata")


def test_an_exit_is_described_in_words_and_merged_with_what_followed(tmp_path):
    assert service_exits.exit_cause(-9) == "was killed by signal 9 (SIGKILL)"
    assert service_exits.exit_cause(3) == "exited with code 3"
    path = tmp_path / "restarts.jsonl"
    event = ServiceExit("triton", 100.0, "was killed by signal 11 (SIGSEGV)", "tail")
    service_exits.record(path, event)
    service_exits.record(path, ServiceExit("image_host", 150.0, "exited with code 1", ""))
    event.outcome, event.back_at = service_exits.BACK, 112.0
    service_exits.record(path, event)
    triton, image_host = service_exits.read(path)
    assert (triton.outcome, triton.back_at, image_host.outcome) == ("back", 112.0, "restarting")
    assert triton.between(105.0, 130.0) and triton.between(90.0, 101.0) and not triton.between(113.0, 200.0)
    assert image_host.between(1000.0, 2000.0), "still down: any later run spans it"
    assert "restarted, back 12 s later" in triton.describe()


class CountingServer:
    """A Triton model's statistics, a service's /metrics and Triton's log, as a fake load moves them
    on: what the lab counts over a run, with no server."""

    def __init__(self, log: Path) -> None:
        self.served, self.log = 0, log
        log.write_text("earlier lines\n")

    def triton_stats(self, address: str, model: str, version=None, timeout_s: float = 10.0) -> dict:
        timed = {"count": self.served, "ns": self.served * 2_000_000}
        return {
            "model_stats": [
                {
                    "name": model,
                    "version": "1",
                    "inference_count": self.served,
                    "execution_count": self.served,
                    "inference_stats": {"success": timed, "queue": timed, "compute_infer": timed},
                    "batch_stats": [{"batch_size": 1, "compute_infer": timed}],
                }
            ]
        }

    def metrics(self, url: str, timeout_s: float = 10.0) -> dict:
        return {
            ("predict_requests_total", (("status", "200"),)): float(self.served),
            ("predict_inference_seconds_count", ()): float(self.served),
            ("predict_inference_seconds_sum", ()): 0.02 * self.served,
        }

    def load(self, result: RunResult) -> Callable[..., RunResult]:
        """A fake load generator that serves 8 requests (3 of them answered CANCELLED by the model),
        after 5 of warm-up where its caller asks to be told when measurement starts."""

        def run(*args, on_measuring: Callable[[], None] | None = None, **kwargs) -> RunResult:
            if on_measuring:
                self.served += 5
                on_measuring()
            self.served += 8
            with self.log.open("a") as log:
                log.write("food_classifier_onnx: 3 cancelled request(s) answered CANCELLED, not computed\n")
            time.sleep(0.2)  # a few resource samples
            return dataclasses.replace(result)

        return run


def test_a_run_measured_with_what_to_count_over_it_is_saved_whole_every_field_equal(tmp_path, monkeypatch):
    lab = local_lab(tmp_path, monkeypatch, triton_http="127.0.0.1:1", triton_grpc="127.0.0.1:2")
    server = CountingServer(tmp_path / "triton.log")
    monkeypatch.setattr(lab.triton, "log", lambda: server.log)
    monkeypatch.setattr(triton_stats, "fetch", server.triton_stats)
    monkeypatch.setattr(service_stats, "scrape", server.metrics)
    nan_latency = LatencySummary.of([])  # NaN, which equals nothing, even itself
    monkeypatch.setattr(loadgen, "closed_loop", server.load(run("loadgen", rps=0.0)))
    frames = sequence_run("x", 4, 1, sequences_failed={"evicted": 1}, sequence_latency=nan_latency)
    monkeypatch.setattr(loadgen, "sequence_loop", server.load(frames))
    perf = server.load(run("food_classifier_onnx"))

    def perf_analyzer(model, started, **load):
        measured = dataclasses.replace(perf(), tool="perf_analyzer", command=["perf_analyzer", "-m", model])
        return dataclasses.replace(measured, server_breakdown={"server_queue_us": 9.0})

    monkeypatch.setattr(lab.triton, "run_perf_analyzer", perf_analyzer)
    monkeypatch.setattr(lab.triton.configs, "served_instances", lambda model: 1)
    monkeypatch.setattr(lab.triton.configs, "served_config", lambda model: {})

    grpc = lab.measurer.closed_loop(
        lab.triton_grpc, 8, 1.0, "triton, grpc", kind="triton-grpc", model="food_classifier_onnx", triton_stats=True
    )
    fastapi = lab.concurrent("onnx", 8, url="http://127.0.0.1:3", resources=ResourceSampler(interval_s=0.05))
    ray = lab.measurer.closed_loop("http://127.0.0.1:4", 8, 1.0, "ray_serve", service_stats=True)
    sequences = lab.measurer.sequences("food_classifier_onnx", 2, 4, "triton, sequences", triton_stats=True)
    perf_run = lab.triton.perf("food_classifier_onnx", concurrency=8, triton_stats=True)

    assert grpc.triton_stats is not None and grpc.triton_stats["success_count"] == 8
    assert grpc.triton_stats["cancelled_by_model"] == 3, "the model's log lines of this run only"
    assert math.isnan(grpc.triton_stats["avg_compute_input_us"]) and grpc.triton_stats["executions_by_batch_size"]
    assert fastapi.service_stats is not None and fastapi.resources is not None and fastapi.resources["t_s"]
    # Counted from the end of the warm-up: the 8 measured requests, not the 5 before them.
    assert fastapi.service_stats["stage_counts"]["inference"] == 8
    assert sequences.triton_stats is not None and sequences.triton_stats["success_count"] == 8
    assert ray.service_stats is not None and ray.service_stats["stage_counts"]["inference"] == 8
    assert sequences.triton_stats is not None and perf_run is not None and perf_run.triton_stats is not None
    assert perf_run.command == ["perf_analyzer", "-m", "food_classifier_onnx"] and perf_run.resources is not None
    saved = Lab.saved_runs("toy")
    assert [saved_fields(result) for result in saved] == [saved_fields(result) for result in lab.results]
    assert len(saved) == 5 and isinstance(saved[3], SequenceRunResult)
    assert saved[0].to_dict() != grpc.to_dict(), "JSON made its keys strings and NaN equals nothing: compared as saved"

    batch = figure(grpc, "triton_stats.avg_batch_size", "average batch")
    lab.expect("counted before the save", condition("a batch of one", batch.value == 1, batch))
    assert "HELD: counted before the save" in lab.verdicts()


def test_an_account_the_server_cannot_give_after_the_run_is_a_note_and_the_run_is_still_saved(
    tmp_path, monkeypatch, capsys
):
    lab = local_lab(tmp_path, monkeypatch, triton_http="127.0.0.1:1")
    server = CountingServer(tmp_path / "triton.log")
    monkeypatch.setattr(lab.triton, "log", lambda: server.log)

    def crashed_under_the_load(*args, **kwargs):
        if not server.served:
            return server.triton_stats(*args, **kwargs)
        raise triton_stats.TritonStatsError("cannot read Triton statistics: connection refused")

    monkeypatch.setattr(triton_stats, "fetch", crashed_under_the_load)
    monkeypatch.setattr(loadgen, "closed_loop", server.load(run("loadgen")))
    result = lab.measurer.closed_loop(
        lab.triton_http, 8, 1.0, "triton", kind="triton-http", model="food_classifier_onnx", triton_stats=True
    )
    assert result.triton_stats is None
    assert result.notes == [
        "no triton_stats: they could not be read after the run (cannot read Triton statistics: connection refused)"
    ]
    assert "NOTE: no triton_stats" in capsys.readouterr().out
    ((saved, _),) = load_appended(tmp_path / "results" / "toy.jsonl")
    assert saved_fields(saved) == saved_fields(result)
