"""Notebook 6's claims on a GPU machine (`make test-gpu-notebook6`, servelab/bench/gpu_check/notebook6.py):
the instance groups it types, the batched request it sends, its report, and the whole run for real on
the CPU, with only what a bare GPU machine has (and Triton's server and client, carried there)."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import psutil
import pytest

from servelab import paths
from servelab.bench.gpu_check import notebook6
from servelab.lessons.expectations import Outcome
from servelab.lessons.triton_bench.checks_capacity import instances_stop_helping
from servelab.loadgen.targets import TritonHttpTarget
from servelab.service.hardware import Hardware
from servelab.triton.adaptation import PYTHON_BACKEND
from servelab.triton.models import ModelRepository
from servelab.triton.server import served_config
from tests.helpers import synthetic_run
from tests.helpers.bare_machine import bare_machine_environment, bare_machine_records
from tests.helpers.gpu_check_table import rows_by


@pytest.mark.parametrize("gpus, kind", [(1, "KIND_GPU"), (0, "KIND_CPU")])
def test_each_count_is_typed_as_a_student_types_a_group_and_served_as_that_many_instances(gpus, kind):
    model = ModelRepository().get("food_classifier")
    typed = model.config.with_text(notebook6.instance_group(4))
    served = served_config(model, typed, None, Hardware(gpus=gpus, cores=2, backends=(PYTHON_BACKEND,)))
    (group,) = served.proto.instance_group
    assert group.count == 4
    assert served.text.count(kind) == 1
    assert list(group.gpus) == ([0] if gpus else [])


def test_a_request_of_16_images_carries_the_one_image_16_times_in_one_batch():
    image = paths.SAMPLE_IMAGE.read_bytes()
    one = TritonHttpTarget("127.0.0.1:8000", "food_classifier", image)
    sixteen = TritonHttpTarget("127.0.0.1:8000", "food_classifier", image, batch_size=notebook6.BATCH)

    def header(target: TritonHttpTarget) -> dict:
        return json.loads(target.body[: int(target.headers["Inference-Header-Content-Length"])])

    (single,), (batched,) = header(one)["inputs"], header(sixteen)["inputs"]
    assert single["shape"][0] == 1 and batched["shape"] == [16, *single["shape"][1:]]
    assert batched["parameters"]["binary_data_size"] == 16 * single["parameters"]["binary_data_size"]
    raw = one.body[int(one.headers["Inference-Header-Content-Length"]) :]
    assert sixteen.body.endswith(raw * 16)


@pytest.mark.parametrize("counts", [["2", "4", "8"], ["1", "1", "2"]])
def test_the_instance_counts_are_three_different_ones_and_one_of_them_is_1(counts, capsys):
    with pytest.raises(SystemExit) as exited:
        notebook6.main(["--instances", *counts])
    assert exited.value.code == 2
    assert "three different counts, one of them 1" in capsys.readouterr().err


def test_a_claims_reason_is_said_whether_it_held_or_not_and_once():
    runs = {count: synthetic_run(f"{count}", concurrency=8, throughput_rps=rate) for count, rate in ((1, 10), (2, 25))}
    held = instances_stop_helping({**runs, 4: synthetic_run("4", concurrency=8, throughput_rps=26)}, "a GPU", 4)
    missed = instances_stop_helping({**runs, 4: synthetic_run("4", concurrency=8, throughput_rps=40)}, "a GPU", 4)
    assert held.outcome is Outcome.HELD and missed.outcome is Outcome.NOT_HELD
    assert notebook6.said(held).count(held.reason) == notebook6.said(missed).count(missed.reason) == 1


@pytest.mark.integration
@pytest.mark.timeout(900)
def test_the_claims_are_measured_and_judged_on_the_cpu_with_what_a_bare_gpu_machine_has(tmp_path, built_artifacts):
    # tritonclient and pytriton travel to such a machine in scripts/gpu_check_wheels.sh's triton-server.tar.xz.
    env = bare_machine_environment(tmp_path, also_there=frozenset({"tritonclient", "pytriton"}))
    args = [*"--device cpu --seconds 1 --warmup 0.5 --out".split(), str(tmp_path / "out")]
    command = [sys.executable, "-m", "servelab.bench.gpu_check.notebook6", *args]
    checked = subprocess.run(command, cwd=paths.REPO_ROOT, env=env, capture_output=True, text=True, timeout=840)
    assert checked.returncode == 0, checked.stdout + checked.stderr[-4000:]
    assert "CPU mode (--device cpu): nothing ran on a GPU." in checked.stdout
    table = rows_by(checked.stdout, "run")
    single, batched = (
        table["1 instance, 1 client, 1 image a request"],
        table["1 instance, 1 client, 16 images a request"],
    )
    by_count = {count: table[f"{count} instance{'s' * (count > 1)}, 8 clients"] for count in (1, 2, 4)}
    assert len(table) == 5
    for row in table.values():
        assert float(row["req/s"]) > 0 and row["errors"] == "0" and row["GPU busy (%)"] == "-"
        # Triton's statistics, model.py's own clock and the instances' CPU, each read over the run.
        for heading in ("compute infer (ms)", "decode (ms)", "forward pass (ms)", "instances' CPU (% of a core)"):
            assert float(row[heading]) > 0, (heading, row)
    # One instance and 8 clients: each request waits for those ahead of it; one client never waits.
    assert float(by_count[1]["queue (ms)"]) > float(by_count[1]["compute infer (ms)"]) > float(single["queue (ms)"])
    claims = re.findall(
        r"^Expectation: (.*)\n  -> (HELD|DID NOT HOLD|NOT CHECKED) on this machine", checked.stdout, re.M
    )
    assert [claim for claim, _ in claims] == [
        "a batch of 16 costs little more than a batch of 1",
        "more Python-backend instances help while the hardware has idle capacity, and stop helping when it has none",
    ]
    assert "16 images in" in checked.stdout and "with 4: the instances used" in checked.stdout  # the reasons
    (written,) = (tmp_path / "out").glob("notebook6-*.md")
    assert rows_by(written.read_text(), "run") == table
    record = json.loads(next((tmp_path / "out").glob("notebook6-*.json")).read_text())
    assert record["metadata"]["verdicts"] == dict(claims)
    assert [result["batch_size"] for result in record["results"]] == [1, 16, 1, 1, 1]
    assert batched["images/s"] == f"{16 * record['results'][1]['throughput_rps']:.1f}"
    commands = bare_machine_records(tmp_path / "imports")
    assert any("-m servelab.bench.gpu_check.notebook6" in command for command in commands)
    left = [int(path.stem) for path in (tmp_path / "imports").glob("*.txt") if psutil.pid_exists(int(path.stem))]
    assert [pid for pid in left if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE] == [], "every process stopped"
