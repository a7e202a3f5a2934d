"""The GPU check (`make test-gpu`) on a bare GPU machine, simulated (tests/helpers/bare_machine.py):
the wheels it carries, its stop without a GPU, the whole check run once for real on the CPU with only
what such a machine has importable (and Triton's server and client, carried there), read by several
tests, and a GPU the runtimes cannot use. Its verdicts and table: test_gpu_check.py."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest

from servelab import paths
from servelab.bench.gpu_check import check
from servelab.bench.gpu_check.verdicts import PASS
from tests.helpers.bare_machine import (
    bare_machine_environment,
    bare_machine_records,
    carried_wheels,
    lacking_on_a_bare_gpu_machine,
)
from tests.helpers.gpu_check_table import CEILING, rows_by, table_of

# A run of the check takes 1 to 3 minutes on 2 idle cores, more on a busy machine: the limit ends a hang.
pytestmark = pytest.mark.timeout(900)


def test_the_wheels_carried_are_those_the_services_need_beyond_a_bare_gpu_machine():
    wheels = {"fastapi", "starlette", "pydantic", "pydantic-core", "uvicorn", "opentelemetry-api"}
    assert wheels | {"python-rapidjson", "protobuf"} <= carried_wheels()  # the last two for tritonclient
    lacking = lacking_on_a_bare_gpu_machine()
    assert {"tritonclient", "pytriton", "ray", "flask", "jupytext", "nbclient", "httptools"} <= lacking
    assert not {"fastapi", "uvicorn", "opentelemetry", "torch", "onnxruntime", "numpy", "aiohttp", "psutil"} & lacking


def run_check(args: str, out: Path, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    """The check run with `args` (split at spaces), writing to `out`, from the repository's root."""
    command = [sys.executable, "-m", "servelab.bench.gpu_check", *args.split(), "--out", str(out)]
    return subprocess.run(command, cwd=paths.REPO_ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def test_without_a_gpu_it_stops_at_once_saying_what_each_source_saw(tmp_path):
    # No nvidia-smi on PATH, no NVML (a bare machine may have nvidia-ml-py: blocked here), no GPU for PyTorch.
    env = {**bare_machine_environment(tmp_path), "PATH": str(tmp_path / "no-nvidia-smi"), "CUDA_VISIBLE_DEVICES": ""}
    env["BARE_MACHINE_LACKS"] += ",pynvml"
    checked = run_check("", tmp_path / "out", env, timeout=120)
    assert checked.returncode == check.EXIT_CANNOT_RUN, checked.stderr
    assert "No NVIDIA GPU here" in checked.stderr
    assert "nvidia-smi: no GPU (not on PATH)" in checked.stderr
    assert "NVML: no GPU (" in checked.stderr
    assert re.search(r"PyTorch: no GPU \(.*torch", checked.stderr)
    assert "starting" not in checked.stderr, "nothing is started without a GPU"
    assert not (tmp_path / "out").exists()


@pytest.fixture(scope="module")
def cpu_check(tmp_path_factory, built_artifacts) -> tuple[subprocess.CompletedProcess, Path]:
    """The run, and the folder of its output and import records: every service at every concurrency, as `make
    test-gpu` runs them, on the CPU. tritonclient and pytriton (its tritonserver) travel to a bare GPU machine
    in scripts/gpu_check_wheels.sh's triton-server.tar.xz."""
    folder = tmp_path_factory.mktemp("cpu-check")
    env = bare_machine_environment(folder, also_there=frozenset({"tritonclient", "pytriton"}))
    checked = run_check("--device cpu --seconds 0.5 --warmup 0.25", folder / "out", env, 840)
    assert checked.returncode == 0, checked.stdout + checked.stderr[-4000:]
    return checked, folder


@pytest.mark.integration
def test_the_whole_check_runs_on_the_cpu_with_only_what_a_bare_gpu_machine_has(cpu_check):
    checked, folder = cpu_check
    assert "nothing on a GPU was checked" in checked.stdout
    rows = rows_by(checked.stdout, "service")
    assert set(rows) == {"fastapi_pt", "fastapi_onnx", "naive/pytorch", "triton/food_classifier", "all services"}
    for name in ("fastapi_pt", "fastapi_onnx"):
        assert rows[name]["runs on (its own report)"] == "cpu"
        assert rows[name]["verdict"].startswith("PASS: on the CPU as asked, first inference")
        for concurrency in (1, 16, 64):
            assert float(rows[name][f"c={concurrency} (req/s)"]) > 0
            assert rows[name][f"c={concurrency} / ceiling"].endswith("x")
        assert rows[name]["GPU memory (MiB)"] == "-"
    assert rows["fastapi_pt"][CEILING].startswith("pytorch: ")
    assert rows["fastapi_onnx"][CEILING].startswith("onnxruntime: ")
    (written,) = (folder / "out").glob("gpu-check-*.md")
    assert table_of(written.read_text().split("## Every run")[0]) == table_of(checked.stdout)
    record = json.loads(next((folder / "out").glob("gpu-check-*.json")).read_text())
    assert {result["name"] for result in record["results"]} >= {"fastapi_pt", "fastapi_onnx", "in-process/pytorch"}
    assert record["metadata"]["services"]["fastapi_pt"]["verdict"] == PASS


@pytest.mark.integration
def test_triton_is_checked_with_the_server_and_client_carried_there(cpu_check):
    triton = rows_by(cpu_check[0].stdout, "service")["triton/food_classifier"]
    assert triton["runs on (its own report)"] == "cpu"
    assert triton["verdict"].startswith("PASS: 1 instance(s) on the CPU as asked")
    for concurrency in (1, 16, 64):
        assert float(triton[f"c={concurrency} (req/s)"]) > 0
        assert triton[f"c={concurrency} / ceiling"].endswith("x")
    assert triton[CEILING].startswith("pytorch: ")


@pytest.mark.integration
def test_every_process_the_check_starts_imports_only_a_bare_gpu_machine_s_packages_and_ends(cpu_check):
    records = cpu_check[1] / "imports"
    commands = bare_machine_records(records)
    kinds = ["-m servelab.loadgen.processes", "-m uvicorn app:app", "servelab.measure.inprocess"]
    kinds.append("-m servelab.bench.gpu_check ")  # the check itself
    for kind in kinds:
        assert any(kind in command for command in commands), f"no process of {kind} recorded: {list(commands)}"
    assert [int(path.stem) for path in records.glob("*.txt") if psutil.pid_exists(int(path.stem))] == [], "all ended"


# An NVIDIA driver's nvidia-smi with a P100 that nothing here can use: PyTorch and ONNX Runtime run on the CPU.
# Every process on the machine holds 100 MiB of it.
UNUSABLE_GPU_SMI = textwrap.dedent(
    """\
    #!/bin/sh
    case "$*" in
      *query-compute-apps*) ps -eo pid= | sed 's/^ *\\([0-9]*\\)$/\\1, 100/' ;;
      *driver_version*) echo "Tesla P100-PCIE-16GB, 16384, 535.183.01" ;;
      *query-gpu=index*) echo "0, Tesla P100-PCIE-16GB, 7, 1200, 16384" ;;
      *) exit 9 ;;
    esac
    """
)


@pytest.mark.integration
def test_on_a_gpu_the_runtimes_cannot_use_pytorch_fails_saying_why_and_onnx_runtime_is_cpu(tmp_path, built_artifacts):
    driver = tmp_path / "driver"
    driver.mkdir()
    (driver / "nvidia-smi").write_text(UNUSABLE_GPU_SMI)
    # A server carried along without tritonclient: never started, as the table says.
    (driver / "tritonserver").write_text("#!/bin/sh\nexit 1\n")
    for tool in driver.iterdir():
        tool.chmod(0o755)
    env = {**bare_machine_environment(tmp_path), "PATH": f"{driver}{os.pathsep}{os.environ['PATH']}"}
    args = f"--services fastapi_pt fastapi_onnx triton --tritonserver {driver / 'tritonserver'} --concurrency 1"
    checked = run_check(f"{args} --seconds 1 --warmup 0.5", tmp_path / "out", env, 840)
    assert checked.returncode == check.EXIT_FAILED, checked.stdout + checked.stderr[-4000:]
    assert "Machine: Tesla P100-PCIE-16GB (16384 MiB), driver 535.183.01" in checked.stdout
    assert "nvidia-smi: Tesla P100-PCIE-16GB (driver 535.183.01)" in checked.stdout
    assert "On the GPU." in checked.stdout
    rows = rows_by(checked.stdout, "service")
    assert rows["fastapi_pt"]["runs on (its own report)"] == "cpu"
    assert rows["fastapi_pt"]["verdict"].startswith("FAIL: on cpu instead of the GPU: ")
    assert rows["fastapi_onnx"]["verdict"].startswith("CPU: this ONNX Runtime has no CUDA provider")
    assert rows["fastapi_onnx"][CEILING].startswith("onnxruntime: ")  # its ceiling on the CPU, where it runs
    assert "Ceiling onnxruntime: " in checked.stdout and "(on cpu (onnxruntime" in checked.stdout
    assert all(float(rows[name]["c=1 (req/s)"]) > 0 for name in ("fastapi_pt", "fastapi_onnx"))
    assert rows["fastapi_pt"]["GPU memory (MiB)"] == rows["fastapi_onnx"]["GPU memory (MiB)"] == "100"
    assert rows["all services"]["GPU memory (MiB)"] == "200 (total)"
    assert rows["fastapi_pt"]["GPU busy at c=1 (%)"] == "7.0"
    assert "on the whole GPU: at most 1200 of 16384 MiB (Tesla P100-PCIE-16GB)" in checked.stdout
    # The lab's Triton tooling needs tritonclient, which a bare GPU machine lacks: said, not failed.
    assert rows["triton/food_classifier"]["verdict"] == (
        f"NOT RUN: {driver / 'tritonserver'} (--tritonserver) is here, but the lab's Triton tooling needs "
        "tritonclient, not installed"
    )
