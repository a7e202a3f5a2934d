"""What notebooks 6 and 7 show beside their checks (servelab.lessons.triton_bench): the devices'
use, the batches that ran, the queueing view against M/G/1, their figures."""

import dataclasses

import matplotlib.pyplot as plt

from servelab.lab.triton_side import Capacity
from servelab.lessons import triton_bench
from servelab.report import plots
from tests.helpers.lessons import perf_run, poisson


def sampled(throughput_rps, mean_ms, processes=None, gpus=()):
    gpu = {"name": "H100", "memory_used_mib": [1, 1], "memory_total_mib": 80}
    series = {"t_s": [0, 1], "cpu_percent": [90, 90], "memory_percent": [5, 5], "gpu_source": "nvml"}
    series["gpus"] = [{**gpu, "index": index, "util_percent": [util, util]} for index, util in enumerate(gpus)]
    resources = {**series, "processes": processes} if processes else series
    return perf_run(throughput_rps=throughput_rps, mean_ms=mean_ms, resources=resources)


def test_device_use_says_whether_the_latency_grew_while_the_device_was_not_full():
    on_gpu = {"c=1": sampled(40, 25, gpus=(20, 0)), "c=16": sampled(40, 400, gpus=(35, 0))}
    said = triton_bench.device_use(on_gpu, cores=8, sweep=True)
    assert "c=16: 400.0 ms mean latency; GPU 0 35.0% busy, GPU 1 0.0% busy" in said
    assert said.endswith(
        "at most 35% busy: not full, so the requests wait for the instance, not the device, and "
        "more instances can use what one leaves idle."
    )
    on_cpu = {"c=1": sampled(30, 30, {"i0": 150}), "c=8": sampled(33, 240, {"i0": 186})}
    full = triton_bench.device_use(on_cpu, cores=2, sweep=True)
    assert "the instances used 186% of a core, of the 200% this machine has; 17.7 requests per second of CPU" in full
    assert "with the device 93% busy: full" in full
    assert "not full" not in triton_bench.device_use(on_cpu, cores=2)  # no sweep: no conclusion


def test_batches_ran_reads_the_largest_batch_and_the_compute_per_image_at_the_highest_rate():
    without = {"50 req/s": poisson(50, 8, 1, 6), "150 req/s": poisson(150, 40, 30, 6)}
    on = {
        "50 req/s": poisson(50, 8, 1, 6, batches={1: 10, 2: 3}, per_image={1: 6, 2: 4}),
        "150 req/s": poisson(150, 10, 2, 3, batches={1: 10, 4: 30, 8: 0}, per_image={1: 6, 4: 2}),
    }
    histograms, said = triton_bench.batches_ran(without, on)
    assert list(histograms) == ["50 req/s, dynamic batching", "150 req/s, dynamic batching", "150 req/s, no batching"]
    assert said.splitlines() == [
        "The largest batch that ran: 4.",
        "no batching, 150 req/s: compute per image, by batch size: 1: 6.00 ms (100 executions)",
        "dynamic batching, 150 req/s: compute per image, by batch size: 1: 6.00 ms (10 executions), 4: 2.00 ms "
        "(30 executions)",
    ]


def test_the_queueing_view_compares_the_runs_with_m_g_1_and_says_what_was_measured():
    alone = perf_run(throughput_rps=100, mean_ms=10, compute_ms=8)
    alone.latency.std_ms = 5.0  # cv2 = 0.25
    capacity = Capacity("m", "1 instance", alone, perf_run(throughput_rps=100, compute_ms=9, concurrency=4))
    view = triton_bench.queueing_view({"50 req/s": poisson(50, 20, 6, 8), "90 req/s": None}, capacity)
    lines = view.splitlines()
    assert len(lines) == 7 and lines[1].startswith("  50 req/s |  50%")
    assert "squared coefficient of variation is 0.25" in view and "(4 clients)" in view
    assert triton_bench.queueing_view({"90 req/s": None}, capacity).startswith("No queueing comparison")


def test_the_batches_and_the_queueing_view_are_drawn_and_said(capsys, monkeypatch):
    drawn = []
    monkeypatch.setattr(plt, "show", lambda: drawn.append(plt.gcf()))  # the figure each view just drew
    without = {"50 req/s": poisson(50, 8, 1, 6), "150 req/s": poisson(150, 40, 30, 6)}
    on = {
        "50 req/s": poisson(50, 8, 1, 6, batches={1: 10, 2: 3}, per_image={1: 6, 2: 4}),
        "150 req/s": poisson(150, 10, 2, 3, batches={1: 10, 4: 30}, per_image={1: 6, 4: 2}),
    }
    triton_bench.show_batches(without, on)
    assert capsys.readouterr().out.startswith("The largest batch that ran: 4.")
    alone = perf_run(throughput_rps=100, mean_ms=10, compute_ms=8)
    capacity = Capacity("m", "1 instance", alone, perf_run(throughput_rps=200, compute_ms=4, concurrency=4))
    constant = dataclasses.replace(poisson(50, 9, 0.5, 6), arrival="constant")
    triton_bench.show_queueing(without, capacity, constant=constant)
    assert "The measured mean latencies are" in capsys.readouterr().out
    batches, queueing = drawn
    assert "by batch size" in batches.axes[0].get_title()
    legend = [text.get_text() for text in queueing.axes[0].get_legend().get_texts()]
    assert any("constant arrivals: measured" in label for label in legend)
    assert any("poisson arrivals: measured" in label for label in legend)
    plt.close("all")


def test_the_cpu_of_each_instance_is_plotted_where_it_was_measured_and_said_missing_where_not(capsys):
    series = {"t_s": [0, 1], "cpu_percent": [90, 90], "memory_percent": [5, 5], "gpus": [], "gpu_source": "none"}
    out_of_sight = {"1 instance": perf_run(resources={**series, "processes": {}}), "4 instances": None}
    assert plots.plot_process_cpu(out_of_sight) is None  # in Docker: the instances run in Triton's container
    assert "No CPU per process to plot" in capsys.readouterr().out
    seen = {"1 instance": perf_run(resources={**series, "processes": {"food_classifier_0_0": 98.0}})}
    figure = plots.plot_process_cpu(seen, cores=2)
    assert figure is not None and "all 2 cores busy (200%)" in figure.axes[0].get_legend().get_texts()[0].get_text()
    plt.close("all")
