"""The helpers every notebook shares: the compose project's Triton and restarts, the rates at a
share of a measured capacity, a config adapted to the server's GPUs, the profiles, the tables,
perf_analyzer retries, reading GourmetGram's result page. Servers are real; only the retry test
replaces perf_analyzer. The lessons' checks: test_lab_checks.py."""

from __future__ import annotations

import dataclasses
import re
import time

import pytest

from food11 import LABELS
from servelab import loadgen, service_exits
from servelab.lab import Lab, connecting, measuring, triton_configs, ui
from servelab.lab.triton_side import TOP_LOAD, Capacity, rates_at_capacity
from servelab.profiles import PROFILES, profile
from servelab.report import tables
from servelab.results import LatencySummary, RunResult
from servelab.service.hardware import Hardware
from servelab.settings import Settings, settings
from servelab.triton import perf_analyzer
from servelab.triton.adaptation import adapt_to_server, gpus_missing
from servelab.triton.config import TritonConfig
from tests.helpers import make_image_bytes, synthetic_run
from tests.helpers.perf_runs import perf_result


def compose_lab(repository, **parts) -> Lab:
    """A Lab of the Compose project's Triton (triton:8000), loading `repository`."""
    return Lab("compose", profile("quick"), {}, "triton:8000", "triton:8001", repository, **parts)


def test_in_the_compose_project_triton_s_log_is_the_copy_beside_its_repository_when_there_is_one(tmp_path):
    lab = compose_lab(tmp_path / "models")
    copy = tmp_path / "triton.log"
    assert lab.triton.log() is None  # the server has not written it (yet)
    copy.write_text("I1123 model.py:1] food_classifier_onnx: 2 cancelled request(s)\n")
    assert lab.triton.log() == copy


def test_in_the_compose_project_a_triton_restart_is_back_once_triton_answers_again(tmp_path, monkeypatch):
    exits = tmp_path / "restarts.jsonl"
    lab = compose_lab(tmp_path / "models", shared_exits_file=exits)
    service_exits.record(exits, service_exits.ServiceExit("triton", time.time(), "exited", "Signal (11)"))
    monkeypatch.setattr("servelab.lab.run_keeper.answers", lambda url: False)
    (event,) = lab.keeper.service_exits()
    assert event.outcome == service_exits.RESTARTING
    monkeypatch.setattr("servelab.lab.run_keeper.answers", lambda url: url == "http://triton:8000/v2/health/ready")
    (event,) = lab.keeper.service_exits()
    assert event.outcome == service_exits.BACK and event.back_at is not None
    assert lab.keeper.service_exits()[0].back_at == event.back_at  # first seen back, not each time asked
    lab.keeper.wait_for_services()  # nothing left to wait for


def test_in_the_compose_project_a_service_crashed_before_its_restart_is_recorded_is_waited_for(tmp_path, monkeypatch):
    """Docker restarts a crashed container after a delay, and its start records the restart: in
    between, Triton is silent and nothing says why. A measurement waits for it all the same."""
    lab = compose_lab(tmp_path / "models", shared_exits_file=tmp_path / "restarts.jsonl")  # nothing recorded yet
    back_at = time.monotonic() + 1.0
    monkeypatch.setattr("servelab.lab.run_keeper.answers", lambda url: time.monotonic() >= back_at)
    monkeypatch.setattr("servelab.lab.run_keeper.time.sleep", lambda seconds: None)  # a fake clock's wait
    lab.keeper.wait_for_services()
    assert time.monotonic() >= back_at, "it returned while Triton was silent"


def test_a_fastapi_url_says_where_a_browser_reaches_the_service_locally_and_in_the_compose_project():
    compose = Lab("compose", profile("quick"), {"onnx": "http://fastapi_onnx:8000"}, None, None, None)
    assert compose.fastapi_url("onnx") == "http://fastapi_onnx:8000"  # as the notebook reaches it, by its name
    assert compose.fastapi_url("onnx").browser == f"http://127.0.0.1:{settings().port_fastapi_onnx}"  # published
    local = Lab("local", profile("quick"), {"pt": "http://127.0.0.1:8100"}, None, None, None)
    assert local.fastapi_url("pt").browser == "http://127.0.0.1:8100"


@pytest.mark.parametrize("triton", [False, True], ids=["fastapi-only", "with-triton"])
def test_in_the_compose_project_a_notebook_without_triton_neither_waits_for_it_nor_reads_its_restarts(
    tmp_path, monkeypatch, triton
):
    """On the node Triton's image may still be building while notebooks 3 and 4 run (servelab.node_build)."""
    compose = {
        "LAB_SERVICES": "compose",
        "FASTAPI_PT_URL": "http://fastapi_pt:8000",
        "FASTAPI_ONNX_URL": "http://fastapi_onnx:8000",
        "IMAGE_HOST_URL": "http://image_host:8000",
        "TRITON_HTTP": "triton:8000",
        "TRITON_GRPC": "triton:8001",
        "TRITON_METRICS_URL": "http://triton:8002/metrics",
        "TRITON_SHARED_DIR": str(tmp_path),
    }
    monkeypatch.setattr("servelab.lab.connecting.settings", lambda: Settings.from_environ(compose))
    waited: list[str] = []
    monkeypatch.setattr("servelab.lab.connecting.wait_until_answering", lambda urls: waited.extend(urls))
    monkeypatch.setattr("servelab.lab.connecting.answers", lambda url: True)  # Triton answers: no build to follow
    Hardware(gpus=0, cores=2).write(tmp_path / "hardware.json")
    lab = Lab(**connecting.compose(profile("quick"), "3_fastapi", triton))
    assert ("triton" in waited, lab.triton_http is not None) == (triton, triton)
    service_exits.record(
        tmp_path / service_exits.EVENTS_FILE, service_exits.ServiceExit("triton", time.time(), "exited", "")
    )
    monkeypatch.setattr("servelab.lab.run_keeper.answers", lambda url: True)
    assert [event.service for event in lab.keeper.service_exits()] == (["triton"] if triton else [])


def capacity_of(rps: float) -> Capacity:
    return Capacity(
        "food_classifier_onnx", "1 instance", perf_result(), dataclasses.replace(perf_result(), throughput_rps=rps)
    )


def lab_on(server: Hardware, served_instances: list[dict], monkeypatch) -> Lab:
    """A Lab whose Triton server has `server`'s hardware and reports `served_instances` as its
    model's instance groups."""
    lab = compose_lab(None, triton_server=server)
    monkeypatch.setattr(lab.triton.configs, "served_config", lambda model: {"instance_group": served_instances})
    return lab


def test_the_rates_are_shares_of_the_measured_capacity_on_a_cpu_and_on_any_gpu(monkeypatch, capsys):
    reference = [120, 180, 240, 300]
    on_cpu = lab_on(Hardware(gpus=0, cores=2), [{"count": 1, "kind": "KIND_CPU"}], monkeypatch)
    on_gpu = lab_on(Hardware(gpus=1, cores=16), [{"count": 1, "kind": "KIND_GPU", "gpus": [0]}], monkeypatch)
    rates = on_cpu.triton.scale_rates(reference, capacity_of(40.0))
    cpu_said = capsys.readouterr().out
    assert on_gpu.triton.scale_rates(reference, capacity_of(40.0)) == rates == [14.4, 21.6, 28.8, 36.0]
    gpu_said = capsys.readouterr().out
    assert rates[-1] == pytest.approx(TOP_LOAD * 40.0)
    assert [rate / rates[-1] for rate in rates] == pytest.approx([rate / reference[-1] for rate in reference])
    # Ten times the capacity, ten times the rates: the same shares of it on a faster device.
    assert on_gpu.triton.scale_rates(reference, capacity_of(400.0)) == pytest.approx([10 * rate for rate in rates])
    # What it did, in figures read from the run: the capacity, where the model runs, what the server has.
    assert "capacity measured in this run is 40.0 req/s" in cpu_said
    assert "runs on the CPU of a Triton server with no GPU, 2 CPU core(s)" in cpu_said
    assert "runs on GPU 0 of a Triton server with 1 GPU(s), 16 CPU core(s)" in gpu_said
    assert "the rates would offer 300% to 750% of it" in cpu_said
    assert cpu_said.endswith("they are 14.4, 21.6, 28.8 and 36 req/s (36%, 54%, 72% and 90% of it).\n")


@pytest.mark.parametrize("capacity_rps", [0.05, 0.7, 3.0, 37.3, 1234.5, 20000.0])
def test_rounding_keeps_the_scaled_rates_distinct_above_zero_and_the_top_at_the_stated_share(capacity_rps):
    rates = rates_at_capacity([120, 180, 240, 300], capacity_rps)
    assert len(set(rates)) == 4 and min(rates) > 0 and rates == sorted(rates)
    assert rates[-1] == pytest.approx(TOP_LOAD * capacity_rps, rel=0.005)


def test_rates_that_three_figures_would_merge_or_round_to_zero_get_more_decimals():
    assert rates_at_capacity([10000, 10001], 1.0) == [0.8999, 0.9]  # 0.900 and 0.900 at three figures
    assert rates_at_capacity([1, 10000], 1.0) == [0.0001, 0.9]  # 0.000 at three figures
    with pytest.raises(ValueError, match="must be positive"):
        rates_at_capacity([0, 120], 10.0)


def test_a_config_naming_gpus_the_server_lacks_is_served_on_the_gpus_it_has_and_says_so(tmp_path, monkeypatch, capsys):
    loaded = []

    class Triton:  # the calls apply_config makes, answered as a server that loads the model
        def __init__(self, url, **options):
            pass

        def load_model(self, model):
            loaded.append(model)

        def is_model_ready(self, model):
            return True

        def get_model_config(self, model):  # what it serves: the config it was given, its groups as Triton lists them
            served = TritonConfig.read(tmp_path / model / "config.pbtxt").proto.instance_group
            return {"instance_group": [{"count": group.count, "gpus": list(group.gpus)} for group in served]}

    monkeypatch.setattr(triton_configs.triton_http, "InferenceServerClient", Triton)
    one_gpu = Hardware(gpus=1, cores=16, backends=("onnxruntime", "python", "pytorch"))
    lab = compose_lab(tmp_path, triton_server=one_gpu)
    (tmp_path / "food_classifier").mkdir()
    two_per_gpu = [{"count": 2, "kind": "KIND_GPU", "gpus": [0]}, {"count": 2, "kind": "KIND_GPU", "gpus": [1]}]
    edited = lab.triton.configs.config("food_classifier").with_instance_groups(two_per_gpu)
    assert lab.triton.configs.apply_config("food_classifier", edited) == 4  # the instances the server reports it runs
    served = TritonConfig.read(tmp_path / "food_classifier" / "config.pbtxt")
    assert [(group.count, list(group.gpus)) for group in served.proto.instance_group] == [(2, [0]), (2, [0])]
    printed = capsys.readouterr().out
    assert (
        "(1 GPU(s), 16 CPU core(s), backends onnxruntime, python, pytorch): the instances written for GPU 1, "
        "which it lacks, run on GPU 0, as many as written:\n" in printed
    )
    assert "-    gpus: [ 1 ]\n+    gpus: [ 0 ]\n" in printed and loaded == ["food_classifier"]
    # A group's count is per listed GPU: two on each of GPUs 0 and 1 is four on GPU 0.
    two_on_each_gpu = lab.triton.configs.config("food_classifier").with_instance_groups(
        [{"count": 2, "kind": "KIND_GPU", "gpus": [0, 1]}]
    )
    (group,) = adapt_to_server(two_on_each_gpu, one_gpu).proto.instance_group
    assert (group.count, group.kind, list(group.gpus)) == (4, group.KIND_GPU, [0])
    # Three GPUs onto two do not spread evenly: one group per GPU, as many instances, names kept apart.
    uneven = lab.triton.configs.config("food_classifier").with_instance_groups(
        [{"name": "spread", "count": 1, "kind": "KIND_GPU", "gpus": [0, 1, 2]}, {"count": 1, "kind": "KIND_CPU"}]
    )
    adapted = adapt_to_server(uneven, dataclasses.replace(one_gpu, gpus=2))
    assert [(group.name, group.count, list(group.gpus)) for group in adapted.proto.instance_group] == [
        ("spread_gpu0", 2, [0]),
        ("spread_gpu1", 1, [1]),
        ("", 1, []),
    ]
    assert adapted.instance_count() == uneven.instance_count() == 4
    # Where the server has every GPU named, the groups stay as written; without a GPU, nothing is missing.
    assert adapt_to_server(two_on_each_gpu, dataclasses.replace(one_gpu, gpus=2)).proto.instance_group[0].gpus == [0, 1]
    assert gpus_missing(uneven, dataclasses.replace(one_gpu, gpus=0)) == []


def test_profiles_are_defined_once_and_an_unknown_one_is_refused():
    assert profile("quick") is PROFILES["quick"] and profile("full").duration_s > profile("quick").duration_s
    with pytest.raises(ValueError, match="LAB_PROFILE='fast'.*full, quick"):
        Settings.from_environ({"LAB_PROFILE": "fast"})


@pytest.mark.parametrize("name", ["quick", "full"])
def test_a_closed_loop_left_to_the_profile_runs_its_duration_and_never_less_than_the_minimum(monkeypatch, name):
    lab = Lab("local", profile(name), {}, None, None, None, notebook="toy")
    loads = []
    monkeypatch.setattr(loadgen, "closed_loop", lambda endpoint, load, progress: loads.append(load) or synthetic_run())
    monkeypatch.setattr(lab.keeper, "ready_to_measure", time.time)
    monkeypatch.setattr(lab.keeper, "keep", lambda result, kept_as, started: kept_as)
    assert lab.measurer.closed_loop("http://127.0.0.1:9", 4) == "http://127.0.0.1:9, 4 client(s)"
    assert loads[0].duration_s == max(profile(name).duration_s, measuring.CLOSED_LOOP_MIN_S)
    lab.measurer.closed_loop("http://127.0.0.1:9", 4, 1.5, "a step")
    assert loads[1].duration_s == 1.5


def sampled_gpus(*busy: list[float]) -> dict:
    """A sampler's series (servelab.measure.resources) with one GPU per list of busy percentages."""
    gpus = [
        {
            "index": i,
            "name": "Tesla P100",
            "util_percent": list(u),
            "memory_used_mib": [900.0] * len(u),
            "memory_total_mib": 16384.0,
        }
        for i, u in enumerate(busy)
    ]
    return {
        "t_s": [0.5, 1.0, 1.5],
        "cpu_percent": [50.0] * 3,
        "memory_percent": [10.0] * 3,
        "gpus": gpus,
        "gpu_source": "nvml",
    }


def test_each_run_s_table_shows_how_busy_each_gpu_was_where_the_run_sampled_one():
    one, two = perf_result(), perf_result()
    one.resources = sampled_gpus([40.0, 50.0, 60.0], [10.0, 20.0, 30.0])
    breakdown = tables.breakdown_table({"2 GPUs": one, "not sampled": two, "c=16": None}).splitlines()
    assert breakdown[0].endswith("| GPU busy (%)")
    assert re.search(r"\|\s+50, 20$", breakdown[1]) and re.search(r"\|\s+-$", breakdown[2])
    results = tables.results_table([one, two]).splitlines()
    assert results[0].endswith("| GPU busy (%) |")
    assert results[2].endswith("| 50, 20 |") and results[3].endswith("| - |")
    # A CPU machine samples no GPU: no column at all.
    two.resources = sampled_gpus()
    assert "GPU busy" not in tables.breakdown_table({"cpu": two}) + tables.results_table([two])


def test_the_breakdown_table_shows_each_stage_in_ms_and_says_when_a_run_gave_no_number():
    table = tables.breakdown_table({"c=1": perf_result(2000, 5000), "c=16": None})
    header, first, missing = table.splitlines()
    assert "queue ms" in header and "compute infer ms" in header
    assert re.search(r"c=1 \|\s+42\.0 \|\s+8\.0 \|\s+9\.5 \|\s+2\.0 \|\s+5\.0$", first)
    assert missing.strip() == "c=16 | no stable measurement"
    short = tables.breakdown_table({"c=1": perf_result(requests=10)}).splitlines()[1]
    assert re.search(r"\|\s+8\.0 \|\s+n/a \|", short)  # 10 requests say nothing about the p95
    with pytest.raises(ValueError, match="only perf_analyzer runs"):
        RunResult("fastapi", "loadgen", "closed", 1, 1.0, LatencySummary.of([1.0]), 1.0).server_ms("queue")


def test_perf_retries_an_unstable_measurement_and_gives_none_when_it_never_settles(monkeypatch, capsys):
    lab = Lab("local", profile("quick"), {}, "127.0.0.1:1", "127.0.0.1:2", None)
    counted = perf_result()
    counted.command = ["/venv/bin/perf_analyzer", "-m", "toy", "--concurrency-range", "2"]
    outcomes = [perf_analyzer.NoStableMeasurement("the windows never agreed", ""), counted]

    def perf(model, started, **load):
        outcome = outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    monkeypatch.setattr(lab.triton, "run_perf_analyzer", perf)
    monkeypatch.setattr(lab.triton.configs, "served_instances", lambda model: 2)
    monkeypatch.setattr(lab.triton.configs, "served_config", lambda model: 'name: "toy"\ndynamic_batching { }\n')
    measured = lab.triton.perf("toy", concurrency=2)
    assert measured.name.endswith(", 2 instances, dynamic batching")
    printed = capsys.readouterr().out
    assert "the windows never agreed (attempt 1 of 2)" in printed
    # The attempt that counted is the one kept, with its command printed under its summary.
    assert measured is counted
    assert "2 instances, dynamic batching [perf_analyzer, c=2]: 42.0 req/s" in printed
    assert printed.endswith("(40 requests)\n  command: perf_analyzer -m toy --concurrency-range 2\n")
    outcomes[:] = [perf_analyzer.NoStableMeasurement("no request completed", "")] * 2
    assert lab.triton.perf("toy", concurrency=2) is None
    assert "gave up every time, so this run has no result" in capsys.readouterr().out


@pytest.mark.integration
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


@pytest.mark.integration
def test_a_result_page_is_read_as_a_browser_shows_it(gourmetgram):
    url = gourmetgram("fastapi_onnx")
    answer = ui.upload(url, "lunch.jpg", make_image_bytes(7))
    assert answer.status == 200 and answer.label in LABELS and answer.error is None
    assert re.fullmatch(r"\d+\.\d% probability", answer.probability)
    assert answer.answered_by.startswith("answered by fastapi in ") and answer.backend.startswith("backend: fastapi at")
    refused = ui.upload(url, "notes.jpg", b"not an image")
    assert (refused.status, refused.label, refused.heading) == (400, None, "That is not an image we can read")
    assert "JPEG or PNG" in refused.error
    with pytest.raises(RuntimeError, match="answered HTTP 400"):
        ui.GourmetGram(url).upload("notes.jpg", b"not an image")
    sample = ui.GourmetGram(url).upload("soup.jpg")  # a sample photo, read by its name
    assert sample.status == 200 and sample.label in LABELS
    with pytest.raises(ValueError, match="not one of GourmetGram's sample photos \\(bread.jpg, .*soup.jpg\\)"):
        ui.GourmetGram(url).upload("pizza.jpg")  # a name that is no sample: said, before any request


def test_an_account_reads_what_a_warm_up_changes_before_it_and_the_run_after_it():
    """`counted` with `after_warmup`: each account prepares before the warm-up (a closed loop opens its
    connections there), starts where the measurement starts, and is read once the run has ended."""
    from servelab.lab.run_accounts import Account, counted

    calls = []

    class Recording(Account):
        field = "service_stats"

        def prepare(self) -> None:
            calls.append("prepare")

        def start(self) -> None:
            calls.append("start")

        def stop(self) -> None:
            calls.append("stop")

        def read(self) -> dict:
            calls.append("read")
            return {"read": True}

    def measure(on_measuring):
        calls.append("warm-up")
        on_measuring()
        calls.append("measured")
        return synthetic_run()

    result = counted(measure, [Recording()], after_warmup=True)
    assert calls == ["prepare", "warm-up", "start", "measured", "stop", "read"]
    assert result.service_stats == {"read": True}
