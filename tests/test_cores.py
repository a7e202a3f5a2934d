"""Thread plans: the cores a process may use, and how slots and threads share them."""

import os
import subprocess
import sys

import pytest

from servelab import paths
from servelab.service import cores
from servelab.service.cores import available_cores, thread_plan


def test_available_cores_follow_the_cpu_affinity():
    script = (
        "import os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); "
        "from servelab.service import cores; print(cores.available_cores())"
    )
    pinned = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, cwd=paths.REPO_ROOT
    )
    assert pinned.stdout.strip() == "1"
    assert available_cores() == min(len(os.sched_getaffinity(0)), available_cores())


@pytest.mark.parametrize(
    ("cpu_max", "expected"), [("150000 100000\n", 1), ("400000 100000\n", 4), ("max 100000\n", None), ("", None)]
)
def test_a_container_cpu_quota_caps_the_cores(tmp_path, monkeypatch, cpu_max, expected):
    quota_file = tmp_path / "cpu.max"
    quota_file.write_text(cpu_max)
    monkeypatch.setattr(cores, "CGROUP_V2_CPU_MAX", quota_file)
    monkeypatch.setattr(cores, "CGROUP_V1_QUOTA", tmp_path / "missing")
    affinity = len(os.sched_getaffinity(0))
    assert available_cores() == (affinity if expected is None else min(affinity, expected))


@pytest.mark.parametrize(
    ("given", "slots", "threads", "oversubscribed"),
    [
        ({"cores": 4}, 4, 1, False),  # the default on a CPU: a slot per core, one thread each
        ({"slots": 1, "cores": 8}, 1, 8, False),  # a single slot gets every core
        ({"device": "cuda (Tesla P100)", "cores": 8}, 8, 1, False),  # beside a GPU too, a slot per core
        ({"slots": 2, "cores": 2, "given_by": "2 instances"}, 2, 1, False),  # instances share the cores out
        ({"slots": 4, "device": "cuda:0", "cores": 8, "given_by": "4 instances"}, 4, 2, False),
        ({"slots": 8, "cores": 2}, 8, 1, True),  # at least one thread each, and crowded
    ],
)
def test_a_plan_shares_the_cores_out_and_a_crowded_one_says_so(given, slots, threads, oversubscribed):
    plan = thread_plan(environ={}, **given)
    assert (plan.slots, plan.threads, plan.busy_threads) == (slots, threads, slots * threads)
    assert plan.oversubscribed == oversubscribed == ("MORE THREADS THAN CORES" in plan.describe())
    chosen_by = f"set by {given.get('given_by', 'the caller')}" if "slots" in given else "the defaults"
    assert f"({chosen_by})" in plan.describe()


def test_environment_variables_set_the_plan_and_a_crowded_one_says_so():
    environ = {"PREDICT_CONCURRENCY": "2", "INFERENCE_THREADS": "2"}
    plan = thread_plan(cores=2, environ=environ)
    assert (plan.slots, plan.threads, plan.busy_threads) == (2, 2, 4)
    assert plan.oversubscribed and "MORE THREADS THAN CORES" in plan.describe()
    assert "PREDICT_CONCURRENCY=2, INFERENCE_THREADS=2" in plan.describe()


@pytest.mark.parametrize("value", ["0", "two", "-1"])
def test_a_bad_setting_is_refused_with_what_to_do(value):
    with pytest.raises(ValueError, match="INFERENCE_THREADS=.*(whole number|at least 1)"):
        thread_plan(cores=2, environ={"INFERENCE_THREADS": value})


@pytest.mark.parametrize(
    ("machine_cores", "on_gpu", "processes", "cores_each"),
    [
        (2, False, 1, 2),  # this machine: one process, as before the plan had processes
        (3, False, 1, 3),  # an odd core left over goes to the one process
        (16, False, 8, 2),  # the lent GPU machine's cores
        (48, False, 24, 2),  # the P100 node's CPU: 2 x 12-core Xeons, 48 threads
        (2, True, 1, 2),  # a GPU beside 2 cores: one process
        (16, True, 4, 4),  # the H200 machine
        (48, True, 4, 12),  # the P100 node: at most 4 processes on its GPU, 12 cores each
    ],
)
def test_the_service_plan_follows_the_cores_and_the_device(machine_cores, on_gpu, processes, cores_each):
    plan = cores.service_plan(machine_cores, on_gpu)
    # A slot per core of a process's share, on either device, as app.py plans them.
    assert (plan.processes, plan.cores_each, plan.slots) == (processes, cores_each, cores_each)
    # Threads are a resource: the processes' inference slots never outnumber the cores.
    assert plan.processes * plan.slots <= machine_cores
    assert plan.chosen_by == "the defaults"


def test_a_given_process_count_shares_the_cores_out_and_says_who_chose_it():
    plan = cores.service_plan(16, on_gpu=False, processes=2)
    assert (plan.processes, plan.cores_each, plan.slots) == (2, 8, 8)
    assert "WEB_CONCURRENCY=2" in plan.describe()
    crowded = cores.service_plan(2, on_gpu=False, processes=4)
    assert (crowded.cores_each, crowded.slots) == (1, 1)  # never a share of no core


def test_a_single_process_plan_gives_the_thread_plan_its_default_slots():
    assert thread_plan(cores=16, environ={}).slots == cores.service_plan(16, False, processes=1).slots == 16
    assert thread_plan(device="cuda", cores=16, environ={}).slots == 16
