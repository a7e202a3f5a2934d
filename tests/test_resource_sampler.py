"""The resource sampler (servelab.measure.resources): the CPU, each core, memory and every GPU."""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
import time

import pytest

from servelab.measure.resources import NO_GPU, ResourceSampler, summarize
from tests.helpers import until

BURN_CPU = "import time\nend = time.monotonic() + 1.5\nwhile time.monotonic() < end:\n    pass\n"


def test_sampler_sees_a_busy_core_and_stops_its_thread():
    with ResourceSampler(interval_s=0.2, pids=[os.getpid()]) as sampler:
        subprocess.run([sys.executable, "-c", BURN_CPU], check=True)
        until(lambda: len(sampler.series()["t_s"]) >= 5, 10, "five samples")  # a busy machine may delay some
    assert not sampler.running
    series = sampler.series()
    assert len(series["t_s"]) >= 5
    assert series["t_s"] == sorted(series["t_s"])
    # One busy core is 100 / cores percent of the machine (6% on 16 cores): look for it per core.
    assert max(series["cpu_percent"]) > 50 / series["cpu_count"]
    assert max(max(cores) for cores in series["cpu_per_core"]) > 50
    assert all(len(cores) == series["cpu_count"] for cores in series["cpu_per_core"])
    assert len(series["memory_percent"]) == len(series["t_s"])
    # The burning child belongs to this test's process tree: up to one whole core (less on a busy machine).
    assert max(series["process_cpu_percent"]) > 20
    assert series["errors"] == []
    summary = sampler.summary()
    assert summary["samples"] == len(series["t_s"])
    assert summary["cpu_percent_max"] == max(series["cpu_percent"])


def test_sampler_stops_when_the_measured_block_raises():
    with pytest.raises(ZeroDivisionError):
        with ResourceSampler(interval_s=0.05) as sampler:
            until(lambda: len(sampler.series()["t_s"]) >= 2, 10, "two samples")
            raise ZeroDivisionError
    assert not sampler.running
    assert len(sampler.series()["t_s"]) >= 2


def _gpu_tools_present() -> bool:
    try:
        import pynvml  # noqa: F401
    except ImportError:
        return shutil.which("nvidia-smi") is not None
    return True


@pytest.mark.skipif(_gpu_tools_present(), reason="NVML or nvidia-smi is present: this machine may have a GPU")
def test_sampler_says_when_there_is_no_gpu():
    with ResourceSampler(interval_s=0.1) as sampler:
        time.sleep(0.3)
    series = sampler.series()
    assert series["gpus"] == []
    assert series["gpu_source"] == NO_GPU
    assert summarize(series)["gpus"] == []


def _fake_nvidia_smi(monkeypatch, folder, script: str) -> None:
    """Put a stand-in `nvidia-smi` first on PATH, and hide NVML, so the nvidia-smi path is taken."""
    binary = folder / "nvidia-smi"
    binary.write_text(f"#!/bin/sh\n{script}\n")
    binary.chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError


def test_sampler_parses_nvidia_smi_output(monkeypatch, tmp_path):
    # Two GPUs; the second one (a MIG slice, say) has no utilization counter.
    _fake_nvidia_smi(
        monkeypatch,
        tmp_path,
        "printf '0, NVIDIA H100 80GB HBM3, 37, 1024, 81559\\n1, NVIDIA A100-SXM4-40GB, [N/A], 2048, 40960\\n'",
    )
    with ResourceSampler(interval_s=0.1) as sampler:
        until(lambda: len(sampler.series()["t_s"]) >= 3, 10, "three samples")
    series = sampler.series()
    assert series["gpu_source"] == "nvidia-smi"
    first, second = series["gpus"]
    assert (first["index"], first["name"], first["memory_total_mib"]) == (0, "NVIDIA H100 80GB HBM3", 81559.0)
    assert set(first["util_percent"]) == {37.0} and set(first["memory_used_mib"]) == {1024.0}
    assert len(first["util_percent"]) == len(series["t_s"]) >= 3
    assert all(math.isnan(value) for value in second["util_percent"])
    summary = summarize(series)["gpus"]
    assert summary[0]["util_percent_mean"] == 37.0 and math.isnan(summary[1]["util_percent_mean"])


def test_sampler_says_why_a_present_nvidia_smi_gave_no_gpu(monkeypatch, tmp_path):
    _fake_nvidia_smi(monkeypatch, tmp_path, "echo 'NVIDIA-SMI has failed: no driver'; exit 9")
    with ResourceSampler(interval_s=0.1) as sampler:
        time.sleep(0.15)
    series = sampler.series()
    assert series["gpus"] == []
    assert series["gpu_source"].startswith("none (no NVIDIA GPU found; nvidia-smi: ")
    assert "no driver" in series["gpu_source"]


@pytest.mark.skipif(shutil.which("nvidia-smi") is None, reason="no nvidia-smi: no GPU to sample")
def test_sampler_reads_every_gpu_when_there_is_one():
    with ResourceSampler(interval_s=0.2) as sampler:
        time.sleep(0.7)
    series = sampler.series()
    assert series["gpu_source"] in ("nvml", "nvidia-smi")
    assert series["gpus"], "nvidia-smi is installed but no GPU was sampled"
    for gpu in series["gpus"]:
        assert len(gpu["util_percent"]) == len(gpu["memory_used_mib"]) == len(series["t_s"])
        assert gpu["memory_total_mib"] > 0
