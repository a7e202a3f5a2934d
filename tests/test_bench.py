"""The headline benchmark's quick profile, end to end against the real local services.

This proves the pipeline works and its numbers are sane (non-zero, no errors, every row and
plot present). It asserts no speed: that is what `make bench` reports, not what a test checks.
"""

import json

import pytest

from servelab import bench
from servelab.results import load_results


@pytest.fixture(scope="module")
def quick_report(model_servers, ports, tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("bench")
    return bench.run_benchmark("quick", out_dir=out_dir, endpoints=bench.Endpoints.of(ports))


def test_every_target_is_measured_at_every_concurrency_without_errors(quick_report):
    results, metadata = load_results(quick_report / "results.json")
    served = {(r.target, r.concurrency) for r in results if r.tool == "loadgen"}
    assert served == {(t.name, c) for t in bench.TARGETS for c in bench.PROFILES["quick"].concurrencies}
    assert {r.target for r in results if r.tool == "in-process"} == {
        "in-process/onnxruntime",
        "in-process/pytorch",
        "in-process/onnxruntime (inference only)",
    }
    for result in results:
        assert result.requests > 0 and result.throughput_rps > 0, result.label
        assert result.errors == {}, result.label
        assert 0 < result.latency.p50_ms <= result.latency.p99_ms, result.label
        assert result.resources and len(result.resources["t_s"]) >= 2, result.label
    triton = [r for r in results if r.target.startswith("triton/")]
    assert all(r.triton_stats["inference_count"] >= r.requests for r in triton)


def test_report_has_machine_weights_versions_table_agreement_and_plots(quick_report):
    report = (quick_report / "report.md").read_text()
    metadata = json.loads((quick_report / "metadata.json").read_text())
    assert metadata["machine"]["cores"] >= 1
    assert f"Weights: **{metadata['weights']['weights']}**" in report
    for package in ("torch", "onnxruntime", "tritonserver"):
        assert f"{package} {metadata['versions'][package]}" in report
    table_rows = [line for line in report.splitlines() if line.startswith("| ") and "%" in line]
    assert len(table_rows) == len(bench.BASELINES) + len(bench.TARGETS) * 3
    agreement = metadata["agreement"]
    assert agreement["perf_analyzer"]["throughput_rps"] > 0 and agreement["loadgen"]["throughput_rps"] > 0
    assert len(agreement["runs"]["loadgen"]) == len(agreement["runs"]["perf_analyzer"]) == agreement["pairs"]
    assert "perf_analyzer" in report and f"{agreement['throughput_gap']:.1%}" in report
    for plot in ("latency_throughput.png", "latency_cdf.png", "batch_sizes.png", "resources.png"):
        image = quick_report / plot
        assert image.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and image.stat().st_size > 5000
        assert f"]({plot})" in report
