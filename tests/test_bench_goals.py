"""The headline benchmark's goals (servelab.bench.goals), from made-up results: which load is judged,
which is only reported, a saturated load generator, the connections' spread, and the figures each
line gives. No server runs: tests/test_bench.py runs the benchmark itself."""

import re

import pytest

from servelab.bench import goals, lone
from servelab.bench import run as bench
from servelab.loadgen.processes import SATURATED_PERCENT
from servelab.report import tables
from servelab.results import LatencySummary, RunResult

JUDGED = goals.GOAL_CONCURRENCY  # 64, the GPU check's


def _served(name: str, throughput: float, p99_ms: float, concurrency: int = JUDGED, cpu: float = 20.0) -> RunResult:
    latencies = [p99_ms / 2] * 98 + [p99_ms] * 2
    result = RunResult(
        name, "loadgen", "closed", 100, throughput, LatencySummary.of(latencies), 10.0, concurrency=concurrency
    )
    result.client = bench.client_use(cpu / 100 * 10.0, 10.0)  # `cpu`% of a core over 10 s
    return result


def _meta(ceilings: dict[str, dict[str, float]], **more) -> dict:
    return {
        "ceilings_rps": ceilings,
        "sweep_best_rps": {"pytorch, decode, many": 100.0, "onnxruntime, decode, many": 100.0},
        "agreement": {"throughput_gap": 0.0, "p50_gap": 0.0},
        **more,
    }


def _line_of(lines: list[str], where: str) -> str:
    (line,) = [line for line in lines if re.match(rf"- [^:]+: {re.escape(where)}[ :](?!is at least)", line)]
    return line


def test_the_load_generators_cpu_is_a_share_of_one_core_saturated_at_the_gpu_checks_threshold():
    assert bench.client_use(4.5, 10.0) == {"processes": 1, "cpu_percent": [45.0], "saturated": False}
    busy = bench.client_use(SATURATED_PERCENT / 100 * 10.0, 10.0)
    assert busy["saturated"] and busy["cpu_percent"] == [SATURATED_PERCENT]
    assert not bench.client_use(SATURATED_PERCENT / 100 * 10.0 - 0.01, 10.0)["saturated"]


def test_triton_is_judged_at_c64_alone_and_its_other_loads_are_reported_with_the_same_figures():
    results = [
        _served("triton/food_classifier", 50.0, 300.0, concurrency=16),
        _served("triton/food_classifier", 85.0, 300.0),
    ]
    meta = _meta({"triton/food_classifier": {"16": 100.0, "64": 100.0}})
    lines = goals.goal_lines(results, meta)
    reported = _line_of(lines, "triton/food_classifier at c=16")
    # Under its goal, and not NOT MET: c=16 is not where it is judged.
    assert reported.startswith(
        "- reported, not judged: triton/food_classifier at c=16 reaches 50.0% of its ceiling (goal 80% at c=64): "
        "50.0 of 100.0 req/s; the load: 1 client process(es) at 20% of a core"
    )
    judged = _line_of(lines, "triton/food_classifier at c=64")
    assert judged.startswith("- met: triton/food_classifier at c=64 reaches 85.0% of its ceiling (goal 80% at c=64)")
    assert "- NOT MEASURED: triton/food_classifier at c=64" not in lines
    # Measured at c=16 alone: c=64 is not measured, and c=16 still not judged.
    lines = goals.goal_lines(results[:1], meta)
    assert "- NOT MEASURED: triton/food_classifier at c=64" in lines
    assert _line_of(lines, "triton/food_classifier at c=16").startswith("- reported, not judged: ")


def test_a_point_whose_load_generator_was_saturated_is_not_judged_met_or_not():
    meta = _meta({"triton/food_classifier": {"64": 100.0}})
    for throughput in (50.0, 95.0):  # under its goal and over it: neither is judged
        results = [_served("triton/food_classifier", throughput, 300.0, cpu=SATURATED_PERCENT + 3)]
        line = _line_of(goals.goal_lines(results, meta), "triton/food_classifier at c=64")
        assert line.startswith(f"- {goals.SATURATED}: triton/food_classifier at c=64 reaches {throughput:.1f}% ")
        assert line.startswith("- NOT JUDGED (the client was saturated") and line.endswith(
            f"the load: 1 client process(es) at {SATURATED_PERCENT + 3:.0f}% of a core"
        )
    # The same point just under the threshold is judged.
    results = [_served("triton/food_classifier", 50.0, 300.0, cpu=SATURATED_PERCENT - 1)]
    line = _line_of(goals.goal_lines(results, meta), "triton/food_classifier at c=64")
    assert line.startswith("- NOT MET: triton/food_classifier at c=64")


def test_a_saturated_load_generator_leaves_the_naive_comparison_not_judged():
    results = [_served("fastapi_onnx", 90.0, 200.0), _served("naive/onnxruntime", 40.0, 600.0, cpu=99.0)]
    meta = _meta({"fastapi_onnx": {"64": 100.0}, "naive/onnxruntime": {"64": 100.0}})
    (line,) = [line for line in goals.goal_lines(results, meta) if "as fast as naive/onnxruntime" in line]
    assert line.startswith(f"- {goals.SATURATED}: fastapi_onnx at c=64 is at least as fast as naive/onnxruntime")
    assert line.endswith("the load: 1 client process(es) at 20% of a core, then 1 client process(es) at 99% of a core")


def test_the_spread_over_a_services_processes_is_shown_from_each_ones_own_count():
    result = _served("fastapi_pt", 80.0, 300.0, concurrency=16)
    result.service_stats = {
        "by_process": {"101": {"requests": 300, "connections": 10}, "102": {"requests": 500, "connections": 22}}
    }
    meta = _meta({"fastapi_pt": {"16": 100.0}}, machine={"cores_available": 2})
    line = _line_of(goals.goal_lines([result], meta), "fastapi_pt at c=16")
    assert line.startswith("- reported, not judged: fastapi_pt at c=16: this run measured no CPU split")
    assert line.endswith(
        f"{tables.BY_PROCESS}, each process's own count over the windows, warm-ups included (one "
        "listening socket hands each new connection to one process, and a kept-alive connection "
        "stays there): 22/500, 10/300"
    )
    # One process: nothing to spread, and no spread is said.
    result.service_stats = {"by_process": {"101": {"requests": 800, "connections": 32}}}
    assert "by process" not in _line_of(goals.goal_lines([result], meta), "fastapi_pt at c=16")


def test_each_window_is_judged_against_the_two_ceiling_windows_beside_it():
    point = {"served_rps": [90.0, 40.0], "ceiling_rps": [100.0, 100.0, 50.0]}
    assert goals.window_fractions(point) == [0.9, pytest.approx(40 / 75)]
    with pytest.raises(ValueError, match="one ceiling window more"):
        goals.window_fractions({"served_rps": [90.0], "ceiling_rps": [100.0]})


def test_the_cap_is_what_the_event_loop_and_the_load_generator_leave_of_the_cpu():
    # 10 s of server CPU (1 s of it on the event loop) and 0.5 s of load generator over 6 s on 2 cores.
    point = {"cpu_s": {"server_s": 10.0, "event_loop_s": 1.0, "load_generator_s": 0.5, "wall_s": 6.0}}
    cpu = bench.CpuSplit(**point["cpu_s"])
    assert cpu.overhead_share() == pytest.approx(1.5 / 10.5) and cpu.cores_busy(2) == pytest.approx(10.5 / 12)
    words = goals.overhead_cap(point, {"machine": {"cores_available": 2}})
    assert "took 14.3% of the CPU its requests cost, which caps it at 85.7% of the ceiling" in words
    assert words.endswith("(they were 87.5% busy)")
    assert goals.overhead_cap({"served_rps": [1.0]}, {}) == ""


def test_a_naive_app_measured_on_a_faster_moment_is_compared_at_one_machine_speed():
    # The service ran while the machine was at 80% of its speed in the sweep, the naive app at 120%:
    # the naive app's raw figures look better, and the comparison must not credit it with the machine.
    results = [_served("fastapi_onnx", 72.0, 300.0), _served("naive/onnxruntime", 90.0, 280.0)]
    meta = _meta({"fastapi_onnx": {"64": 80.0}, "naive/onnxruntime": {"64": 120.0}})
    (line,) = [line for line in goals.goal_lines(results, meta) if "as fast as naive/onnxruntime" in line]
    assert line.startswith("- met: fastapi_onnx at c=64")
    assert "(90.0 vs 75.0 req/s: yes) with a lower p99 (240 vs 336 ms: yes)" in line
    assert "machine at 80% and 120% of that speed: 72.0 vs 90.0 req/s, p99 300 vs 280 ms" in line
    # At one machine speed throughout, it is the raw comparison: here the naive app wins.
    meta["ceilings_rps"]["fastapi_onnx"]["64"] = 120.0
    (line,) = [line for line in goals.goal_lines(results, meta) if "as fast as naive/onnxruntime" in line]
    assert line.startswith("- NOT MET: ") and "(60.0 vs 75.0 req/s: no)" in line


def test_a_ratio_just_under_its_target_is_printed_under_it():
    results = [_served("triton/food_classifier", 79.96, 300.0)]
    lines = goals.goal_lines(results, _meta({"triton/food_classifier": {"64": 100.0}}))
    assert _line_of(lines, "triton/food_classifier at c=64").startswith(
        "- NOT MET: triton/food_classifier at c=64 reaches 79.9% of its ceiling (goal 80% at c=64): 80.0 of 100.0 req/s"
    )


def _judged_against_its_cap(throughput: float, cpu_s: dict | None, concurrency: int = JUDGED) -> str:
    """The goal line of fastapi_onnx at `concurrency`, its ceiling 100 req/s around two windows, on 2 cores."""
    point = {"served_rps": [throughput, throughput], "ceiling_rps": [100.0, 100.0, 100.0]}
    load = str(concurrency)
    meta = _meta(
        {"fastapi_onnx": {load: 100.0}},
        windows_rps={"fastapi_onnx": {load: point | ({"cpu_s": cpu_s} if cpu_s else {})}},
        machine={"cores_available": 2},
    )
    lines = goals.goal_lines([_served("fastapi_onnx", throughput, 300.0, concurrency)], meta)
    return _line_of(lines, f"fastapi_onnx at c={concurrency}")


# 9.5 s of CPU on 2 cores over 5 s (95% busy), 1 s of it on the event loop and the load generator:
# the cap is 8.5 / 9.5 = 89.5% of the ceiling, 89.5 req/s, and the goal 95% of it, 85.0 req/s.
BUSY = {"server_s": 9.0, "event_loop_s": 0.5, "load_generator_s": 0.5, "wall_s": 5.0}


def test_a_fastapi_service_on_busy_cores_is_judged_against_its_cap_not_the_ceiling():
    # 88% of the ceiling: under the 90% of the ceiling it used to be held to, and 98% of what it could reach.
    line = _judged_against_its_cap(88.0, BUSY)
    assert line.startswith(
        "- met: fastapi_onnx at c=64 reaches 98.3% of its cap (goal 95% at c=64): 88.0 of 89.5 req/s"
    )
    assert "took 10.5% of the CPU its requests cost, which caps it at 89.5% of the ceiling" in line
    assert "(they were 95.0% busy); it reaches 88.0% of its ceiling (88.0 of 100.0 req/s)" in line
    assert line.endswith(
        "; window by window, against the ceiling beside each: 88%, 88%; the load: 1 client process(es) at 20% of a core"
    )


def test_a_fastapi_service_under_its_cap_is_not_met_at_c64_and_only_reported_at_c16():
    line = _judged_against_its_cap(84.95, BUSY)
    assert line.startswith(
        "- NOT MET: fastapi_onnx at c=64 reaches 94.9% of its cap (goal 95% at c=64): 85.0 of 89.5 req/s"
    )
    line = _judged_against_its_cap(84.95, BUSY, concurrency=16)
    assert line.startswith(
        "- reported, not judged: fastapi_onnx at c=16 reaches 94.9% of its cap (goal 95% at c=64): 85.0 of 89.5 req/s"
    )


def test_a_fastapi_point_whose_cores_idled_or_had_no_cpu_split_is_not_judged_and_says_why():
    idle = BUSY | {"wall_s": 6.0}  # the same CPU over 6 s: 79% busy
    line = _judged_against_its_cap(60.0, idle)
    assert line.startswith("- NOT JUDGED: fastapi_onnx at c=64: not every core was busy (under 90%)")
    assert "(they were 79.1% busy); it reaches 60.0% of its ceiling (60.0 of 100.0 req/s)" in line
    line = _judged_against_its_cap(60.0, None)
    assert line.startswith("- NOT JUDGED: fastapi_onnx at c=64: this run measured no CPU split")
    assert "no cap to judge it against; it reaches 60.0% of its ceiling" in line


def test_a_load_point_a_server_crash_interrupted_is_not_judged_and_its_row_says_why():
    crashed = _served("fastapi_onnx", 95.0, 300.0)
    crashed.interrupted_by = ["fastapi_onnx was killed by signal 9 (SIGKILL) at 12:00:00; restarted, back 1 s later"]
    lines = goals.goal_lines([crashed], _meta({"fastapi_onnx": {"64": 100.0}}))
    assert f"- NOT JUDGED: fastapi_onnx at c=64: {crashed.interrupted_by[0]}" in lines
    assert not any(line.startswith("- met: fastapi_onnx at c=64 reaches") for line in lines)
    assert "NOT A CLEAN RUN: fastapi_onnx was killed by signal 9" in tables.results_table([crashed])


def _lone(fresh: float, after: float, loop: float = 40.0) -> dict:
    def phase(rps: float, concurrency: int = 1) -> dict:
        return {"rps": rps, "p50_ms": 1000 / rps, "concurrency": concurrency}

    return {"fresh": phase(fresh), "load": phase(60.0, JUDGED), "after": phase(after), "loop": phase(loop)}


def test_a_lone_client_is_judged_against_the_loop_beside_it_fresh_and_after_the_load():
    lines = lone.lone_lines({"fastapi_pt": _lone(34.0, 33.0), "fastapi_onnx": _lone(36.0, 20.0)})
    assert lines[0].startswith("- met: fastapi_pt serves a lone client at 82.5% of the in-process loop right after 64")
    assert "33.0 and 34.0 req/s" in lines[0] and "the loop 40.0 req/s" in lines[0]
    assert lines[1].startswith("- NOT MET: fastapi_onnx serves a lone client at 50.0% of the in-process loop")
    assert lone.lone_lines({"fastapi_pt": _lone(31.0, 36.0)})[0].startswith("- NOT MET"), "fresh counts too"
    (row,) = lone.lone_table({"fastapi_pt": _lone(34.0, 33.0)})[2:]
    assert row == "| fastapi_pt | 34.0 | 60.0 | 33.0 | 40.0 | 82.5% |"
