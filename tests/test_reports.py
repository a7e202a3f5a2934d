"""What a run reports: plots, tables, a service's counts by process, and one load point pooled from its
measured windows."""

from __future__ import annotations

import time

import matplotlib.pyplot as plt
import numpy as np
import pytest

from servelab.measure import queueing
from servelab.measure.resources import NO_GPU, ResourceSampler, summarize
from servelab.report import plots, tables
from servelab.results import LatencySummary, RunResult, load_results, pooled, save_results
from servelab.triton import stats as triton_stats
from tests.helpers.triton_stats import snapshot

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _result(
    name: str,
    tool: str = "loadgen",
    concurrency: int | None = None,
    rate: float | None = None,
    arrival: str | None = None,
    center_ms: float = 20.0,
    throughput: float = 100.0,
    seed: int = 0,
    errors: dict[str, int] | None = None,
) -> RunResult:
    latencies = np.random.default_rng(seed).gamma(4.0, center_ms / 4.0, size=400).tolist()
    return RunResult(
        name=name,
        tool=tool,
        mode="closed" if concurrency is not None else "open",
        requests=len(latencies),
        throughput_rps=throughput,
        latency=LatencySummary.of(latencies),
        wall_s=len(latencies) / throughput,
        concurrency=concurrency,
        rate_rps=rate,
        arrival=arrival,
        errors=errors or {},
        latencies_ms=latencies,
    )


def _closed_results() -> list[RunResult]:
    results = []
    for i, concurrency in enumerate((1, 2, 4, 8, 16)):
        results.append(
            _result(
                "fastapi_onnx",
                concurrency=concurrency,
                center_ms=12 * concurrency**0.8,
                throughput=80 * min(concurrency, 2) + 3 * i,
                seed=i,
            )
        )
        results.append(
            _result(
                "triton/food_classifier_onnx (grpc)",
                tool="perf_analyzer",
                concurrency=concurrency,
                center_ms=10 * concurrency**0.5,
                throughput=90 * concurrency**0.6,
                seed=10 + i,
            )
        )
    return results


def _open_results(service_ms: float = 20.0) -> list[RunResult]:
    results = []
    for arrival, factor in (("poisson", 1.0), ("constant", 0.0)):
        for i, rate in enumerate((10, 20, 30, 40, 45)):
            predicted = queueing.mg1_estimate([rate], service_ms / 1000, 0.0)[0]["latency_ms"]
            center = service_ms + factor * (predicted - service_ms)
            results.append(
                _result("fastapi_onnx", rate=rate, arrival=arrival, center_ms=center, throughput=rate, seed=20 + i)
            )
    return results


def _resource_series(gpus: bool) -> dict:
    t = np.arange(0.5, 12.5, 0.5)
    busy = 20 + 60 * (np.sin(t / 2) ** 2)
    series = {
        "interval_s": 0.5,
        "t_s": t.tolist(),
        "cpu_count": 4,
        "cpu_percent": busy.tolist(),
        "cpu_per_core": [[min(100.0, b * f) for f in (0.6, 0.9, 1.1, 1.4)] for b in busy],
        "memory_percent": (40 + t).tolist(),
        "process_cpu_percent": (busy * 3).tolist(),
        "gpus": [],
        "gpu_source": NO_GPU,
        "errors": [],
    }
    if gpus:
        series["gpus"] = [
            {
                "index": 0,
                "name": "NVIDIA A100",
                "util_percent": (busy * 0.9).tolist(),
                "memory_used_mib": (3000 + 100 * t).tolist(),
                "memory_total_mib": 40960.0,
            }
        ]
        series["gpu_source"] = "nvidia-smi"
    return series


def _check_png(path) -> None:
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC
    assert len(data) > 5_000


@pytest.fixture
def close_figures():
    yield
    plt.close("all")


def test_every_plot_writes_a_png(tmp_path, close_figures):
    closed, opened = _closed_results(), _open_results()
    batches = {
        "no dynamic batching": {"model": "food_classifier", "executions_by_batch_size": {1: 40}, "avg_batch_size": 1.0},
        "dynamic batching": triton_stats.diff(
            snapshot(inferences=0, executions=0, requests=0, ms_each=0.0, batches={}),
            snapshot(inferences=40, executions=9, requests=40, ms_each=9.0, batches={1: 2, 4: 3, 5: 2, 8: 2}),
        ),
    }
    drawings = {
        "concurrency.png": lambda p: plots.plot_latency_throughput_vs_concurrency(closed, path=p),
        "cdf.png": lambda p: plots.plot_latency_cdf(closed[:4], path=p, log_x=True),
        "batches.png": lambda p: plots.plot_batch_sizes(batches, path=p),
        "batches_single.png": lambda p: plots.plot_batch_sizes({1: 5, 3: 2}, path=p),
        "resources.png": lambda p: plots.plot_resources(_resource_series(gpus=False), path=p),
        "resources_gpu.png": lambda p: plots.plot_resources(_resource_series(gpus=True), path=p),
        "queueing.png": lambda p: plots.plot_queueing(opened, 0.020, cv2=0.3, alone_ms=25.0, path=p),
    }
    for name, draw in drawings.items():
        figure = draw(tmp_path / "figures" / name)
        assert figure.axes
        _check_png(tmp_path / "figures" / name)


def test_measurements_saved_in_a_run_result_plot_after_loading(tmp_path, close_figures):
    before = snapshot(inferences=0, executions=0, requests=0, ms_each=0.0, batches={})
    after = snapshot(inferences=7, executions=3, requests=7, ms_each=2.0, batches={1: 1, 2: 1, 4: 1})
    result = _result("triton/food_classifier", concurrency=4)
    result.triton_stats = triton_stats.diff(before, after).to_dict()
    with ResourceSampler(interval_s=0.05) as sampler:
        time.sleep(0.2)
    result.resources = sampler.series()
    save_results([result], tmp_path / "run.json")
    (loaded,), _ = load_results(tmp_path / "run.json")
    # JSON keys are strings: {"1": 1, ...}; the plot reads them back as batch sizes.
    plots.plot_batch_sizes(loaded.triton_stats, path=tmp_path / "batches.png")
    _check_png(tmp_path / "batches.png")
    reloaded, original = summarize(loaded.resources), sampler.summary()
    assert (reloaded["samples"], reloaded["cpu_percent_max"]) == (original["samples"], original["cpu_percent_max"])


def test_plot_batch_sizes_takes_a_list_with_labels(close_figures):
    figure = plots.plot_batch_sizes([{1: 5}, {2: 4}], labels=["before", "after"])
    legend = [text.get_text() for text in figure.axes[0].get_legend().get_texts()]
    assert legend == ["before", "after"]
    with pytest.raises(ValueError, match="labels"):
        plots.plot_batch_sizes([{1: 5}, {2: 4}], labels=["only one"])


def test_plots_refuse_results_they_cannot_draw(close_figures):
    with pytest.raises(ValueError, match="closed-loop"):
        plots.plot_latency_throughput_vs_concurrency(_open_results())
    with pytest.raises(ValueError, match="open-loop"):
        plots.plot_queueing(_closed_results(), 0.02)


def test_results_table_has_one_row_per_result_with_formatted_numbers():
    results = [
        _result("in-process onnx", tool="in-process", concurrency=1, throughput=200.0),
        _result("fastapi_onnx", concurrency=4, throughput=123.44),
        _result("fast|api", rate=50, arrival="poisson", throughput=49.96, errors={"timeout": 2, "http_503": 1}),
    ]
    table = tables.results_table(results, baseline_rps=200.0)
    lines = table.strip().splitlines()
    assert len(lines) == 2 + len(results)
    assert lines[0].startswith("| name | tool | load |") and lines[0].endswith("| vs in-process |")
    assert all(line.count(" | ") == lines[0].count(" | ") for line in lines[2:])
    row = lines[3]
    assert "| fastapi_onnx | loadgen | c=4 | 400 | 123.4 |" in row
    assert f"| {results[1].latency.p50_ms:.1f} | {results[1].latency.p95_ms:.1f} |" in row
    assert row.endswith("| 0 | 61.7% |")
    assert "| fast\\|api | loadgen | 50 req/s poisson |" in lines[4]
    assert "| 3 (http_503: 1, timeout: 2) | 25.0% |" in lines[4]
    assert "vs in-process" not in tables.results_table(results)


def test_results_table_shows_how_a_run_spread_over_a_service_s_processes_where_it_had_several():
    spread = _result("fastapi_onnx, 2 process(es)", concurrency=16, throughput=100.0)
    spread.service_stats = {
        "by_process": {"11": {"requests": 90, "connections": 5}, "12": {"requests": 300, "connections": 11}}
    }
    alone = _result("fastapi_onnx, 1 process(es)", concurrency=16, throughput=80.0)
    alone.service_stats = {"by_process": {"13": {"requests": 390, "connections": 16}}}
    lines = tables.results_table([spread, alone]).strip().splitlines()
    assert lines[0].endswith(f"| {tables.BY_PROCESS} |")
    assert lines[2].endswith("| 11/300, 5/90 |"), "the busiest first"
    assert lines[3].endswith("| - |"), "one process: nothing spread"
    assert tables.BY_PROCESS not in tables.results_table([alone])


def test_a_service_s_own_counts_by_process_are_told_apart_from_its_other_metrics():
    from servelab.measure import service_stats

    def scrape(requests_11: float, connections_12: float) -> dict:
        return {
            ("predict_requests_by_process", (("process", "11"),)): requests_11,
            ("predict_connections_by_process", (("process", "11"),)): 2.0,
            ("predict_requests_by_process", (("process", "12"),)): 0.0,
            ("predict_connections_by_process", (("process", "12"),)): connections_12,
            ("predict_requests_total", (("outcome", "predicted"), ("status", "200"))): requests_11,
        }

    delta = service_stats.diff("http://x", scrape(10.0, 0.0), scrape(25.0, 0.0))
    assert delta.by_process == {"11": {"requests": 15, "connections": 0}, "12": {"requests": 0, "connections": 0}}
    assert delta.requests == 15
    # A closed loop's warm-up opens its connections: counted from a scrape before it, the requests after it.
    warmed = service_stats.diff("http://x", scrape(10.0, 3.0), scrape(25.0, 3.0), connections_since=scrape(4.0, 0.0))
    assert warmed.by_process["11"] == {"requests": 15, "connections": 0}
    assert warmed.by_process["12"] == {"requests": 0, "connections": 3}


def test_results_table_compares_each_target_with_its_own_baseline():
    runs = [_result(name, concurrency=1, throughput=rps) for name, rps in (("a", 50.0), ("b", 30.0), ("c", 5.0))]
    table = tables.results_table(runs, {"a": 100.0, "b": 60.0})
    rows = table.strip().splitlines()[2:]
    assert rows[0].endswith("| 50.0% |") and rows[1].endswith("| 50.0% |") and rows[2].endswith("| n/a |")


def test_throughput_bounds_show_every_line_and_bound_on_the_shared_axis(tmp_path, close_figures):
    panels = {
        "fast host": {"outside": {1: _result("a", concurrency=1, throughput=13), 16: _result("a", throughput=63)}},
        "slow host": {"outside": {1: _result("b", concurrency=1, throughput=4), 16: None}},
    }
    bounds = {"fast host": {"1 / S": 67.0}, "slow host": {"1 / S": 52.6}}
    fig = plots.plot_throughput_bounds(panels, bounds, path=tmp_path / "bounds.png")
    for ax in fig.axes:
        assert ax.get_ylim()[1] >= 67.0  # the highest bound of any panel fits in every panel
    fast, slow = fig.axes
    assert [tuple(line.get_ydata()) for line in fast.lines[:1]] == [(13, 63)]
    assert [tuple(line.get_ydata()) for line in slow.lines[:1]] == [(4,)]  # a missing run is left out
    assert any("1 / S = 52.6 req/s" in text.get_text() for text in slow.get_legend().get_texts())
    assert (tmp_path / "bounds.png").stat().st_size > 0


def test_a_configuration_measured_twice_at_one_concurrency_is_drawn_through_its_median(close_figures):
    runs = [
        _result("svc", concurrency=1, throughput=10),
        _result("svc", concurrency=1, throughput=30),
        _result("svc", concurrency=8, throughput=50),
    ]
    fig = plots.plot_latency_throughput_vs_concurrency(runs)
    throughput_axis = fig.axes[1]
    (line,) = throughput_axis.lines
    assert list(line.get_xdata()) == [1, 8] and list(line.get_ydata()) == [20.0, 50.0]  # no vertical segment
    (repeated,) = throughput_axis.collections  # both runs at c=1 are still shown, as hollow markers
    assert sorted(tuple(point) for point in repeated.get_offsets()) == [(1, 10), (1, 30)]
    assert "median of repeated runs" in throughput_axis.get_legend().get_texts()[0].get_text()


def _window(throughput: float, wall_s: float, latency_ms: float, errors: dict[str, int]) -> RunResult:
    answered = round(throughput * wall_s)
    failed = sum(errors.values())
    return RunResult(
        name="fastapi_onnx",
        tool="loadgen",
        mode="closed",
        requests=answered + failed,
        throughput_rps=throughput,
        latency=LatencySummary.of([latency_ms] * answered),
        wall_s=wall_s,
        concurrency=8,
        errors=errors,
        latencies_ms=[latency_ms] * answered,
        timeline=[[wall_s * (i + 1) / answered, latency_ms, "ok"] for i in range(answered)],
    )


def test_pooled_windows_add_up_requests_and_seconds_and_pool_latencies():
    fast, slow = _window(50.0, 10.0, 20.0, {"http_503": 2}), _window(20.0, 5.0, 80.0, {"http_503": 1, "timeout": 4})
    point = pooled([fast, slow])
    assert point.throughput_rps == pytest.approx(600 / 15)  # not the mean of 50 and 20 req/s
    assert (point.requests, point.wall_s) == (502 + 105, 15.0)
    assert point.errors == {"http_503": 3, "timeout": 4}
    assert point.latency.p50_ms == 20.0 and point.latency.max_ms == 80.0
    assert point.latency.mean_ms == pytest.approx((500 * 20 + 100 * 80) / 600)
    # The second window's timeline starts where the first one's measurement ended.
    assert point.timeline[499][0] == pytest.approx(10.0) and point.timeline[-1][0] == pytest.approx(15.0)
    assert [row[1] for row in point.timeline[499:501]] == [20.0, 80.0]
    assert "pooled from 2 measured windows" in point.notes


def test_pooled_refuses_windows_of_different_load_points():
    other = _window(20.0, 5.0, 80.0, {})
    other.concurrency = 16
    with pytest.raises(ValueError, match="cannot pool"):
        pooled([_window(50.0, 10.0, 20.0, {}), other])
    with pytest.raises(ValueError, match="at least one"):
        pooled([])
