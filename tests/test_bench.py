"""The headline benchmark's quick profile, end to end against the real local services.

This proves the pipeline works and its numbers are sane (non-zero, no errors, every row, ceiling,
target and plot present). It asserts no speed: that is what `make bench` reports, not what a
test checks.
"""

import json
import os
import re
import subprocess
import sys

import pytest
import requests

from servelab.bench import report as bench_report
from servelab.bench import run as bench
from servelab.measure.inprocess import sweep_points
from servelab.profiles import PROFILES
from servelab.report import tables
from servelab.results import LatencySummary, RunResult, load_results
from servelab.service.cores import available_cores

# The quick benchmark, which the first test's setup runs, takes about 3 minutes on 2 idle cores and
# more on a busy machine: the limit is there to end a hang, not to judge its speed (pyproject's 300 s).
pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def quick_report(model_servers, ports, tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("bench")
    pids = model_servers.pids()
    return bench.run_benchmark("quick", out_dir=out_dir, endpoints=bench.Endpoints.of(ports), server_pids=pids)


@pytest.mark.integration
def test_every_setup_and_reference_is_measured_without_errors(quick_report):
    results, _ = load_results(quick_report / "results.json")
    busiest = max(PROFILES["quick"].concurrencies)
    served = {(r.name, r.concurrency) for r in results if r.tool == "loadgen"}
    expected = {(t.name, c) for t in bench.SETUPS for c in PROFILES["quick"].concurrencies}
    assert served == expected | {(name, busiest) for name in bench.NAIVE.values()}
    for result in results:
        assert result.requests > 0 and result.throughput_rps > 0, result.label
        assert result.errors == {}, result.label
        assert 0 < result.latency.p50_ms <= result.latency.p99_ms, result.label
    for result in (r for r in results if r.tool == "loadgen"):
        assert result.resources and len(result.resources["t_s"]) >= 2, result.label
    triton = [r for r in results if r.name.startswith("triton/")]
    assert all(r.triton_stats["inference_count"] >= r.requests for r in triton)


@pytest.mark.integration
def test_each_ceiling_is_the_best_of_its_sweep_measured_again_between_each_runs_windows(quick_report):
    results, metadata = load_results(quick_report / "results.json")
    points = [r for r in results if r.tool == "in-process"]
    cores = available_cores()
    windows = PROFILES["quick"].windows
    swept = sum(len(sweep_points(cores, pipelined)) for pipelined in (False, True)) * len(bench.CEILINGS)
    served = [r for r in results if r.tool == "loadgen"]
    # The ceiling measured again before, between and after the windows of every load point.
    assert len(points) == swept + (windows + 1) * len(served)
    for key, best_rps in metadata["sweep_best_rps"].items():
        sweep = [r for r in points if {f"ceiling: {key}", f"ceiling: {key} (best)"} & set(r.notes)]
        best = [r for r in sweep if f"ceiling: {key} (best)" in r.notes]
        assert len(best) == 1 and best[0].throughput_rps == best_rps == max(r.throughput_rps for r in sweep)
    for run in served:
        in_flight = "one" if run.concurrency == 1 else "many"
        around = [
            r for r in points for turn in range(1, windows + 2)
            if any(
                note.endswith(f", {in_flight} ({turn} of {windows + 1} around {run.name} at c={run.concurrency})")
                for note in r.notes
            )
        ]  # fmt: skip
        assert len(around) == windows + 1 and all(r.throughput_rps > 0 for r in around)
        ceiling = metadata["ceilings_rps"][run.name][str(run.concurrency)]
        assert ceiling == pytest.approx(sum(r.throughput_rps for r in around) / len(around))
        # The load point is its windows pooled: their measured seconds add up to the profile's
        # (each window ends when its last request is answered, so a little more).
        assert f"pooled from {windows} measured windows" in run.notes
        assert run.wall_s >= 0.95 * PROFILES["quick"].duration_s


@pytest.mark.integration
def test_triton_runs_one_instance_per_core_on_a_cpu_and_the_shipped_config_comes_back(quick_report, ports):
    metadata = json.loads((quick_report / "metadata.json").read_text())
    cores = available_cores()
    for setup in (s for s in bench.SETUPS if s.model):
        assert metadata["thread_plans"][setup.name].startswith(f"{cores} inference slot(s)")
        served = requests.get(f"http://127.0.0.1:{ports.triton_http}/v2/models/{setup.model}/config", timeout=5)
        assert [group["count"] for group in served.json()["instance_group"]] == [1]  # as in config.pbtxt


def _windows_said(point: dict) -> str:
    shares = ", ".join(f"{share:.0%}" for share in bench_report.window_fractions(point))
    return f"; window by window, against the ceiling beside each: {shares}"


@pytest.mark.integration
def test_report_has_threads_ceilings_ratios_targets_and_the_generator_cost(quick_report):
    report = (quick_report / "report.md").read_text()
    results, _ = load_results(quick_report / "results.json")
    metadata = json.loads((quick_report / "metadata.json").read_text())
    assert metadata["machine"]["cores_available"] == available_cores()
    assert f"Weights: **{metadata['weights']['weights']}**" in report
    for package in ("torch", "onnxruntime", "tritonserver"):
        assert f"{package} {metadata['versions'][package]}" in report
    for service in ("fastapi_pt", "fastapi_onnx", "triton/food_classifier", "triton/food_classifier_onnx"):
        assert f"- {service}: " in report and "busy threads" in metadata["thread_plans"][service]
    # Every served row carries its ratio to the ceiling of the same work, taken in this run.
    for result in (r for r in results if r.tool == "loadgen"):
        ratio = result.throughput_rps / bench_report.ceiling_of(result, metadata["ceilings_rps"])
        row = re.search(
            rf"\| {re.escape(result.name)} \| loadgen \| c={result.concurrency} \|.*\| ([\d.]+)% \|", report
        )
        assert row and row.group(1) == f"{100 * ratio:.1f}", result.label
    goals = report.split("## Goals")[1].split("##")[0]
    measured = PROFILES["quick"].concurrencies
    judged = sum(load in measured for goal in bench_report.GOALS for load in goal.loads)
    unmeasured = sum(load not in measured for goal in bench_report.GOALS for load in goal.loads)
    assert len(re.findall(r"^- (met|NOT MET|NOT JUDGED): ", goals, re.M)) == judged + len(bench.SETUPS) + 2
    assert len(re.findall(r"^- NOT MEASURED: .* at c=\d+$", goals, re.M)) == unmeasured
    # A FastAPI service is judged against its cap where its point kept every core busy, and only there.
    # Each line shows its windows one by one, and a FastAPI one its CPU split, from the run's own figures.
    for goal in (goal for goal in bench_report.GOALS if goal.of_cap):
        for load in (load for load in goal.loads if load in measured):
            point = metadata["windows_rps"][goal.service][str(load)]
            cpu = bench.CpuSplit(**point["cpu_s"])
            name = re.escape(f"{goal.service} at c={load}")
            (line,) = re.findall(
                rf"^- (?:(?:met|NOT MET): {name} reaches .* of its cap |NOT JUDGED: {name}: ).*", goals, re.M
            )
            if cpu.cores_busy(metadata["machine"]["cores_available"]) >= bench_report.EVERY_CORE_BUSY:
                assert not line.startswith("- NOT JUDGED"), line
            else:
                assert line.startswith(f"- NOT JUDGED: {goal.service} at c={load}: not every core was busy"), line
            assert bench_report.overhead_cap(point, metadata) in line and line.endswith(_windows_said(point)), line
    point = metadata["windows_rps"]["triton/food_classifier"]["16"]
    assert re.search(
        rf"^- (met|NOT MET): triton/food_classifier at c=16 reaches .*{re.escape(_windows_said(point))}$", goals, re.M
    )
    agreement = metadata["agreement"]
    for tool in ("loadgen", "perf_analyzer"):
        assert agreement[tool]["throughput_rps"] > 0 and 0 < agreement[tool]["cpu_ms_per_request"] < 100
    assert len(agreement["runs"]["loadgen"]) == len(agreement["runs"]["perf_analyzer"]) == agreement["pairs"]
    runs = {tool: [RunResult.from_dict(run) for run in runs] for tool, runs in agreement["runs"].items()}
    assert bench.agreement_gaps(runs["loadgen"], runs["perf_analyzer"]) == {
        key: agreement[key] for key in ("throughput_gap", "p50_gap", "pair_ratios")
    }
    assert bench_report.pair_ratios(agreement) in report
    for plot in ("latency_throughput.png", "latency_cdf.png", "batch_sizes.png", "resources.png"):
        image = quick_report / plot
        assert image.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and image.stat().st_size > 5000
        assert f"]({plot})" in report


@pytest.mark.integration
def test_every_fastapi_point_says_where_its_cpu_went_and_the_cap_that_follows(quick_report):
    report = (quick_report / "report.md").read_text()
    metadata = json.loads((quick_report / "metadata.json").read_text())
    section = report.split("## Where a FastAPI service's CPU goes")[1].split("##")[0]
    measured = {"fastapi_pt", "fastapi_onnx", *bench.NAIVE.values()}
    for name, by_load in metadata["windows_rps"].items():
        # Triton's front end is C++ and its models run in processes of their own: no event loop to count.
        assert all(("cpu_s" in point) == (name in measured) for point in by_load.values()), name
        for load, point in by_load.items():
            if name not in measured:
                continue
            cpu = bench.CpuSplit(**point["cpu_s"])
            assert 0 < cpu.event_loop_s < cpu.server_s and cpu.load_generator_s > 0, (name, load)
            assert 0 < cpu.overhead_share() < 1 and cpu.wall_s >= PROFILES["quick"].duration_s
            row = f"| {name} | c={load} | {cpu.event_loop_s / cpu.server_s:.1%} |"
            assert row in section and f"| {1 - cpu.overhead_share():.1%} |" in section


def test_the_cap_is_what_the_event_loop_and_the_load_generator_leave_of_the_cpu():
    # 10 s of server CPU (1 s of it on the event loop) and 0.5 s of load generator over 6 s on 2 cores.
    point = {"cpu_s": {"server_s": 10.0, "event_loop_s": 1.0, "load_generator_s": 0.5, "wall_s": 6.0}}
    cpu = bench.CpuSplit(**point["cpu_s"])
    assert cpu.overhead_share() == pytest.approx(1.5 / 10.5) and cpu.cores_busy(2) == pytest.approx(10.5 / 12)
    words = bench_report.overhead_cap(point, {"machine": {"cores_available": 2}})
    assert "took 14.3% of the CPU its requests cost, which caps it at 85.7% of the ceiling" in words
    assert words.endswith("(they were 87.5% busy)")
    assert bench_report.overhead_cap({"served_rps": [1.0]}, {}) == ""


def test_a_server_that_is_gone_leaves_its_point_without_a_split_instead_of_stopping_the_run(caplog):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    assert bench._cpu_now(gone.pid) is None
    assert f"server process {gone.pid} is gone" in caplog.text
    assert bench._cpu_now(None) is None
    now = bench._cpu_now(os.getpid())  # this process: its main thread is the one running the test
    assert now is not None and 0 < now.event_loop_s <= now.server_s


def test_each_window_is_judged_against_the_two_ceiling_windows_beside_it():
    point = {"served_rps": [90.0, 40.0], "ceiling_rps": [100.0, 100.0, 50.0]}
    assert bench_report.window_fractions(point) == [0.9, pytest.approx(40 / 75)]
    with pytest.raises(ValueError, match="one ceiling window more"):
        bench_report.window_fractions({"served_rps": [90.0], "ceiling_rps": [100.0]})


def test_the_tools_are_compared_pair_by_pair_so_one_slow_moment_does_not_decide():
    # Measured in a full run: the third perf_analyzer run met the machine at two thirds of its
    # speed. Each tool's median would differ by 22.8%; the pairs differ by 3.4%, 6.6% and 57.6%.
    def run(tool: str, throughput: float, p50_ms: float) -> RunResult:
        return RunResult("triton", tool, "closed", 100, throughput, LatencySummary.of([p50_ms]), 10.0)

    ours = [run("loadgen", 97.8, 80.0), run("loadgen", 116.2, 68.0), run("loadgen", 122.0, 65.0)]
    theirs = [run("perf_analyzer", 94.6, 83.0), run("perf_analyzer", 109.0, 72.0), run("perf_analyzer", 77.4, 100.0)]
    gaps = bench.agreement_gaps(ours, theirs)
    assert [round(ratio, 3) for ratio in gaps["pair_ratios"]["throughput"]] == [1.034, 1.066, 1.576]
    assert round(gaps["throughput_gap"], 3) == 0.066 and round(gaps["p50_gap"], 3) == 0.056
    assert bench_report.pair_ratios(gaps) == "throughput 1.03, 1.07, 1.58; p50 0.96, 0.94, 0.65"
    with pytest.raises(ValueError):  # a run without its partner
        bench.agreement_gaps(ours, theirs[:2])


def _served_at_16(name: str, throughput: float, p99_ms: float) -> RunResult:
    latencies = [p99_ms / 2] * 98 + [p99_ms] * 2
    return RunResult(name, "loadgen", "closed", 100, throughput, LatencySummary.of(latencies), 10.0, concurrency=16)


def test_a_naive_app_measured_on_a_faster_moment_is_compared_at_one_machine_speed():
    # The service ran while the machine was at 80% of its speed in the sweep, the naive app at 120%:
    # the naive app's raw figures look better, and the comparison must not credit it with the machine.
    results = [_served_at_16("fastapi_onnx", 72.0, 300.0), _served_at_16("naive/onnxruntime", 90.0, 280.0)]
    meta = {
        "ceilings_rps": {"fastapi_onnx": {"16": 80.0}, "naive/onnxruntime": {"16": 120.0}},
        "sweep_best_rps": {"onnxruntime, decode, many": 100.0},
        "agreement": {"throughput_gap": 0.0, "p50_gap": 0.0},
    }
    (line,) = [line for line in bench_report.goal_lines(results, meta) if "as fast as naive/onnxruntime" in line]
    assert line.startswith("- met: fastapi_onnx at c=16")
    assert "(90.0 vs 75.0 req/s: yes) with a lower p99 (240 vs 336 ms: yes)" in line
    assert "machine at 80% and 120% of that speed: 72.0 vs 90.0 req/s, p99 300 vs 280 ms" in line
    # At one machine speed throughout, it is the raw comparison: here the naive app wins.
    meta["ceilings_rps"]["fastapi_onnx"]["16"] = 120.0
    (line,) = [line for line in bench_report.goal_lines(results, meta) if "as fast as naive/onnxruntime" in line]
    assert line.startswith("- NOT MET: ") and "(60.0 vs 75.0 req/s: no)" in line


def test_a_ratio_just_under_its_target_is_printed_under_it():
    results = [_served_at_16("triton/food_classifier", 79.96, 300.0)]
    meta = {
        "ceilings_rps": {"triton/food_classifier": {"16": 100.0}},
        "sweep_best_rps": {"pytorch, decode, many": 100.0},
        "agreement": {"throughput_gap": 0.0, "p50_gap": 0.0},
    }
    lines = bench_report.goal_lines(results, meta)
    assert (
        "- NOT MET: triton/food_classifier at c=16 reaches 79.9% of its ceiling (goal 80%): 80.0 of 100.0 req/s"
        in lines
    )


def _judged_against_its_cap(throughput: float, cpu_s: dict | None) -> str:
    """The target line of fastapi_onnx at c=16, its ceiling 100 req/s around two windows, on 2 cores."""
    point = {"served_rps": [throughput, throughput], "ceiling_rps": [100.0, 100.0, 100.0]}
    meta = {
        "ceilings_rps": {"fastapi_onnx": {"16": 100.0}},
        "windows_rps": {"fastapi_onnx": {"16": point | ({"cpu_s": cpu_s} if cpu_s else {})}},
        "machine": {"cores_available": 2},
        "sweep_best_rps": {"onnxruntime, decode, many": 100.0},
        "agreement": {"throughput_gap": 0.0, "p50_gap": 0.0},
    }
    lines = bench_report.goal_lines([_served_at_16("fastapi_onnx", throughput, 300.0)], meta)
    (line,) = [line for line in lines if re.match(r"- [A-Za-z ]+: fastapi_onnx at c=16[ :](?!is at least)", line)]
    return line


# 9.5 s of CPU on 2 cores over 5 s (95% busy), 1 s of it on the event loop and the load generator:
# the cap is 8.5 / 9.5 = 89.5% of the ceiling, 89.5 req/s, and the goal 95% of it, 85.0 req/s.
BUSY = {"server_s": 9.0, "event_loop_s": 0.5, "load_generator_s": 0.5, "wall_s": 5.0}


def test_a_fastapi_service_on_busy_cores_is_judged_against_its_cap_not_the_ceiling():
    # 88% of the ceiling: under the 90% of the ceiling it used to be held to, and 98% of what it could reach.
    line = _judged_against_its_cap(88.0, BUSY)
    assert line.startswith("- met: fastapi_onnx at c=16 reaches 98.3% of its cap (goal 95%): 88.0 of 89.5 req/s")
    assert "took 10.5% of the CPU its requests cost, which caps it at 89.5% of the ceiling" in line
    assert "(they were 95.0% busy); it reaches 88.0% of its ceiling (88.0 of 100.0 req/s)" in line
    assert line.endswith("window by window, against the ceiling beside each: 88%, 88%")


def test_a_fastapi_service_under_its_cap_on_busy_cores_is_not_met_and_printed_under_its_target():
    line = _judged_against_its_cap(84.95, BUSY)
    assert line.startswith("- NOT MET: fastapi_onnx at c=16 reaches 94.9% of its cap (goal 95%): 85.0 of 89.5 req/s")


def test_a_fastapi_point_whose_cores_idled_or_had_no_cpu_split_is_not_judged_and_says_why():
    idle = BUSY | {"wall_s": 6.0}  # the same CPU over 6 s: 79% busy
    line = _judged_against_its_cap(60.0, idle)
    assert line.startswith("- NOT JUDGED: fastapi_onnx at c=16: not every core was busy (under 90%)")
    assert "(they were 79.1% busy); it reaches 60.0% of its ceiling (60.0 of 100.0 req/s)" in line
    line = _judged_against_its_cap(60.0, None)
    assert line.startswith("- NOT JUDGED: fastapi_onnx at c=16: this run measured no CPU split")
    assert "no cap to judge it against; it reaches 60.0% of its ceiling" in line


def test_a_load_point_a_server_crash_interrupted_is_not_judged_and_its_row_says_why():
    crashed = _served_at_16("fastapi_onnx", 95.0, 300.0)
    crashed.interrupted_by = ["fastapi_onnx was killed by signal 9 (SIGKILL) at 12:00:00; restarted, back 1 s later"]
    meta = {
        "ceilings_rps": {"fastapi_onnx": {"16": 100.0}},
        "sweep_best_rps": {"onnxruntime, decode, many": 100.0},
        "agreement": {"throughput_gap": 0.0, "p50_gap": 0.0},
    }
    lines = bench_report.goal_lines([crashed], meta)
    assert f"- NOT JUDGED: fastapi_onnx at c=16: {crashed.interrupted_by[0]}" in lines
    assert not any(line.startswith("- met: fastapi_onnx at c=16 reaches") for line in lines)
    assert "NOT A CLEAN RUN: fastapi_onnx was killed by signal 9" in tables.results_table([crashed])
