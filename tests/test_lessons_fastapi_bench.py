"""Notebook 4's checks, each fed a case it must pass and one it must fail, and its thread plans, on a
CPU and on a GPU (the machinery of its other cells: tests/test_lessons_fastapi_bench_cells.py)."""

import pytest

import food11
from servelab import paths
from servelab.lessons import fastapi_bench
from servelab.lessons.expectations import Outcome, machine_cores
from tests.helpers import service_stages, synthetic_run
from tests.helpers.lessons import outcomes


def test_onnx_faster_than_pytorch_holds_and_fails_on_its_two_figures_and_its_reason_reads_the_inference_times():
    pytorch = synthetic_run("fastapi_pt", throughput_rps=30, mean_ms=33, service_stats=service_stages(inference=25))
    onnx = synthetic_run("fastapi_onnx", throughput_rps=90, mean_ms=11, service_stats=service_stages(inference=6))
    held = fastapi_bench.runtime_comparison(pytorch, onnx, "2 CPU cores")
    assert outcomes(held) == [Outcome.HELD]  # one condition: at c=1 the throughput is 1 / the mean, not judged again
    assert "25.0 ms in PyTorch and 6.0 ms in ONNX" in held.reason
    assert held.estimate is not None and held.estimate.value == pytorch.latency.p50_ms / onnx.latency.p50_ms
    # A slower ONNX service.
    slower = synthetic_run("fastapi_onnx", throughput_rps=25, mean_ms=40, service_stats=service_stages(inference=30))
    failed = fastapi_bench.runtime_comparison(pytorch, slower, "2 CPU cores")
    assert outcomes(failed) == [Outcome.NOT_HELD]
    assert fastapi_bench.runtime_comparison(pytorch, None, "cpu").outcome is Outcome.NOT_CHECKED


def loaded_run(throughput_rps: float, mean_ms: float, **stages: float):
    return synthetic_run("fastapi_onnx", 16, throughput_rps, mean_ms, service_stats=service_stages(**stages))


ALONE = synthetic_run("fastapi_onnx", 1, throughput_rps=80, mean_ms=12.5)


def test_queueing_holds_when_the_slots_are_full_and_most_of_the_time_is_the_wait_for_them():
    # 160 req/s x 12 ms = 1.92 of 2 slots in use; 80 of 100 ms waiting for a slot.
    held = fastapi_bench.queueing_under_load(ALONE, loaded_run(160, 100, inference=12, slot_wait=80), 2, "cpu")
    assert held.outcome is Outcome.HELD, held
    assert "1.92 of 2 slot(s)" in held.conditions[1].detail
    assert held.estimate is not None and held.estimate.value == 2.0  # 160 req/s against 80 alone: the number asked


def test_queueing_fails_on_idle_slots_and_on_a_latency_that_is_stretched_service_not_waiting():
    # Throughput no higher than alone, slots idle half the time (80 x 12 ms = 0.96 of 2), and the
    # extra latency spent in stretched stages rather than waiting: every condition fails.
    failed = fastapi_bench.queueing_under_load(ALONE, loaded_run(80, 200, inference=12, slot_wait=40), 2, "cpu")
    assert outcomes(failed) == [Outcome.NOT_HELD] * 3
    assert "in use 48% of the time" in failed.reason


def test_queueing_is_not_checked_when_the_service_timed_nothing():
    run = loaded_run(160, 100, inference=float("nan"), slot_wait=float("nan"))
    assert outcomes(fastapi_bench.queueing_under_load(ALONE, run, 2, "cpu"))[1:] == [Outcome.NOT_CHECKED] * 2


def test_queueing_is_not_checked_with_no_more_senders_than_slots():
    # 2 senders on 2 slots: nothing can wait for a slot, whatever the figures say.
    run = loaded_run(80, 200, inference=12, slot_wait=40)
    run.concurrency = 2
    judged = fastapi_bench.queueing_under_load(ALONE, run, 2, "cpu")
    assert outcomes(judged) == [Outcome.NOT_HELD, Outcome.NOT_CHECKED, Outcome.NOT_CHECKED]
    assert "2 sender(s) for 2 slot(s)" in judged.conditions[2].detail


SHOWN_AS_NAMED = {
    "bread.jpg": ("Bread", "61.0% probability"),
    "fried_egg.jpg": ("Egg", "48.2% probability"),
    "soup.jpg": ("Soup", "90.5% probability"),
}


def test_every_bundled_sample_is_named_for_a_food11_class():
    samples = sorted(path.name for path in (paths.GOURMETGRAM_DIR / "static" / "samples").glob("*.jpg"))
    assert samples == sorted(fastapi_bench.SAMPLE_LABELS)
    assert set(fastapi_bench.SAMPLE_LABELS.values()) <= set(food11.LABELS)


def test_samples_labelled_as_named_hold_on_trained_weights_and_a_miss_fails_that_photo_alone():
    held = fastapi_bench.samples_get_their_labels(SHOWN_AS_NAMED, "trained")
    assert outcomes(held) == [Outcome.HELD] * 3
    assert str(held.conditions[1]) == "  - HELD: fried_egg.jpg is labelled Egg: shown Egg, probability 48.2 %"
    missed = fastapi_bench.samples_get_their_labels({**SHOWN_AS_NAMED, "bread.jpg": ("Dessert", "37.0%")}, "trained")
    assert outcomes(missed) == [Outcome.NOT_HELD, Outcome.HELD, Outcome.HELD]
    assert "shown Dessert, probability 37.0 %" in str(missed.conditions[0])
    assert "1 of 3 samples got another label" in str(missed)


def test_samples_are_not_checked_on_untrained_weights_and_say_why():
    judged = fastapi_bench.samples_get_their_labels(SHOWN_AS_NAMED, "untrained")
    assert outcomes(judged) == [Outcome.NOT_CHECKED] * 3
    assert all(part.detail == "untrained weights: the labels mean nothing" for part in judged.conditions)


LOADED = loaded_run(160, 100, inference=12, slot_wait=80)  # 2 slots, 160 req/s x 12 ms = 1.92 in use: loaded
GPU_LOADED = loaded_run(2000, 8, inference=2, slot_wait=5)  # 2000 x 2 ms = 4 slots in use


@pytest.mark.parametrize(
    "idle, loaded_ms, run, slots, outcome, detail",
    [
        # Idle /health 2 ms, loaded 5 ms: under 2 + 12 / 2, judged against idle, not a prediction.
        ([2.0] * 10, 5.0, LOADED, 2, Outcome.HELD, "under 8.0 ms"),
        # The wrong outcome the old rule passed: an event loop blocked by each inference holds /health
        # for the rest of the running one (9 ms of 12 against 2 idle), still well under one prediction.
        ([2.0] * 10, 9.0, LOADED, 2, Outcome.NOT_HELD, ""),
        # A GPU: inferences of 2 ms, /health at idle 1 ms with a spread of 1.5 ms; a blocked event loop
        # would add a millisecond, which the interpreter's and the network's noise alone can add.
        ([1.0] * 8 + [2.5, 2.5], 2.2, GPU_LOADED, 4, Outcome.NOT_CHECKED, "half an inference, 1.0 ms, is within"),
        ([1.0] * 10, 2.2, GPU_LOADED, 4, Outcome.NOT_HELD, ""),  # no noise at idle: the wait is seen
        # 30 x 12 ms = 0.36 of 2 slots: mostly idle, nothing could make /health wait.
        ([2.0] * 10, 2.5, loaded_run(30, 13, inference=12, slot_wait=0), 2, Outcome.NOT_CHECKED, "the 2 inference"),
    ],
)
def test_health_under_load_is_judged_against_health_at_idle(idle, loaded_ms, run, slots, outcome, detail):
    judged = fastapi_bench.health_stays_out_of_the_queue(idle, [loaded_ms] * 50, run, slots, "cpu")
    assert outcomes(judged) == [outcome] and judged.conditions[0].detail.startswith(detail)
    assert judged.estimate is not None and (judged.estimate.value, judged.estimate.unit) == (loaded_ms, "ms")


def plan_run(name, p50_ms, throughput_rps, inference=10.0):
    return synthetic_run(name, 1, throughput_rps, p50_ms, service_stats=service_stages(inference=inference))


PLANS = fastapi_bench.CorePlans("cpu", cores=4)
ON_A_GPU = fastapi_bench.CorePlans("cuda:0", cores=4)  # the same plans' names, the model on a GPU
CROWDED, FITTING, EVERY, DEFAULT = PLANS.crowded, PLANS.one_core, PLANS.every_core, PLANS.default


def test_crowded_threads_hold_when_slower_and_fail_when_the_extra_threads_found_cores():
    slower = {CROWDED: plan_run(CROWDED, 300, 20), FITTING: plan_run(FITTING, 150, 40)}
    assert outcomes(fastapi_bench.crowded_threads_are_slower(slower, PLANS, "4 cores")) == [Outcome.HELD] * 2
    # The wrong outcome: crowding cost nothing (the threads found idle cores).
    same = {CROWDED: plan_run(CROWDED, 140, 42), FITTING: plan_run(FITTING, 150, 40)}
    assert outcomes(fastapi_bench.crowded_threads_are_slower(same, PLANS, "4 cores")) == [Outcome.NOT_HELD] * 2
    crowded = fastapi_bench.crowded_threads_are_slower(slower, PLANS, "4 cores")
    assert "with 4 slots, 4 threads each" in crowded.claim
    assert crowded.estimate is not None and crowded.estimate.value == 0.5  # 20 req/s against 40
    on_gpu = fastapi_bench.crowded_threads_are_slower(same, ON_A_GPU, "1 GPU")
    assert outcomes(on_gpu) == [Outcome.NOT_CHECKED] * 2 and "cuda:0" in on_gpu.conditions[0].detail


def test_every_core_alone_is_judged_once_on_the_median():
    """One condition: one at a time, the throughput is 1 / the mean latency, the same measurement."""
    faster = {EVERY: plan_run(EVERY, 20, 50, inference=12), FITTING: plan_run(FITTING, 40, 25, inference=32)}
    held = fastapi_bench.every_core_serves_one_faster(faster, PLANS, "4 cores")
    assert outcomes(held) == [Outcome.HELD] and "12.0 ms with 4 threads and 32.0 ms with 1" in held.reason
    assert (
        held.estimate is not None
        and held.estimate.value == faster[EVERY].latency.p50_ms / faster[FITTING].latency.p50_ms
    )
    # The wrong outcome: threads that wait for each other at every layer gain nothing on one image.
    slower = {EVERY: plan_run(EVERY, 42, 24), FITTING: plan_run(FITTING, 40, 25)}
    assert outcomes(fastapi_bench.every_core_serves_one_faster(slower, PLANS, "4 cores")) == [Outcome.NOT_HELD]
    one = fastapi_bench.CorePlans("cpu", cores=1)
    one_core = fastapi_bench.every_core_serves_one_faster(
        {one.every_core: slower[EVERY], one.one_core: slower[FITTING]}, one, "1 core"
    )
    assert outcomes(one_core) == [Outcome.NOT_CHECKED] and "only one thread" in one_core.conditions[0].detail
    on_gpu = fastapi_bench.every_core_serves_one_faster(faster, ON_A_GPU, "1 GPU")
    assert outcomes(on_gpu) == [Outcome.NOT_CHECKED]


def test_the_default_holds_near_the_best_plan_and_fails_far_from_it():
    assert DEFAULT == FITTING  # the services' own plan: a slot per core, one thread each
    alone = {EVERY: plan_run(EVERY, 20, 50), DEFAULT: plan_run(DEFAULT, 21, 48), CROWDED: plan_run(CROWDED, 40, 25)}
    loaded = {EVERY: plan_run(EVERY, 300, 20), DEFAULT: plan_run(DEFAULT, 150, 40), CROWDED: plan_run(CROWDED, 160, 37)}
    held = fastapi_bench.default_near_the_best(alone, loaded, PLANS, 22.0, "4 cores")
    assert outcomes(held) == [Outcome.HELD, Outcome.HELD]
    assert held.estimate is not None and held.estimate.value == 1.0  # the default's rate over the best's: its own
    # The wrong outcome: another plan serves far more under load than the default.
    outrun = {**loaded, EVERY: plan_run(EVERY, 100, 60)}
    failed = fastapi_bench.default_near_the_best(alone, outrun, PLANS, 22.0, "4 cores")
    assert outcomes(failed) == [Outcome.HELD, Outcome.NOT_HELD]
    assert failed.estimate is not None and failed.estimate.value == 40 / 60
    on_gpu = fastapi_bench.default_near_the_best(alone, outrun, ON_A_GPU, 22.0, "1 GPU")
    assert outcomes(on_gpu) == [Outcome.NOT_CHECKED] * 2


def test_the_checks_read_the_machine_where_the_notebook_leaves_its_hardware_out(monkeypatch):
    monkeypatch.setattr(fastapi_bench.checks, "machine_hardware", lambda: "3 CPU core(s) and no GPU")
    monkeypatch.setattr(fastapi_bench.checks_threads, "machine_hardware", lambda: "3 CPU core(s) and no GPU")
    pytorch = synthetic_run("fastapi_pt", throughput_rps=30, mean_ms=33, service_stats=service_stages(inference=25))
    assert fastapi_bench.runtime_comparison(pytorch, pytorch).reason.startswith("on 3 CPU core(s) and no GPU,")
    runs = {CROWDED: plan_run(CROWDED, 300, 20), FITTING: plan_run(FITTING, 150, 40)}
    assert "on 3 CPU core(s) and no GPU," in fastapi_bench.crowded_threads_are_slower(runs, PLANS).reason


def test_processes_follow_the_plan_on_many_cores_and_on_two():
    sixteen, two_cores = fastapi_bench.CorePlans("cpu", cores=16), fastapi_bench.CorePlans("cpu", cores=2)
    assert (sixteen.service.processes, two_cores.service.processes) == (8, 1)  # what the plan calls for
    one = synthetic_run("fastapi_onnx, 1 process", 64, throughput_rps=400)
    many = synthetic_run("fastapi_onnx, 8 processes", 64, throughput_rps=1000)
    assert fastapi_bench.processes_follow_the_plan(one, many, 8, sixteen).outcome is Outcome.HELD
    # Several processes that gain nothing where the plan calls for them: the lock was not the cap.
    flat = synthetic_run("fastapi_onnx, 8 processes", 64, throughput_rps=420)
    assert fastapi_bench.processes_follow_the_plan(one, flat, 8, sixteen).outcome is Outcome.NOT_HELD
    # On two cores the plan is one process: two serve about as much...
    two = synthetic_run("fastapi_onnx, 2 processes", 8, throughput_rps=190)
    alone = synthetic_run("fastapi_onnx, 1 process", 8, throughput_rps=180)
    assert fastapi_bench.processes_follow_the_plan(alone, two, 2, two_cores).outcome is Outcome.HELD
    # ...and much more would say the plan leaves throughput on the table.
    better = synthetic_run("fastapi_onnx, 2 processes", 8, throughput_rps=300)
    failed = fastapi_bench.processes_follow_the_plan(alone, better, 2, two_cores)
    assert failed.outcome is Outcome.NOT_HELD and "x1.67" in failed.reason
    # One process tried against one (the student's edit): the same setting twice, nothing to judge.
    same = fastapi_bench.processes_follow_the_plan(alone, alone, 1, two_cores)
    assert same.outcome is Outcome.NOT_CHECKED and "nothing to compare" in same.conditions[0].detail


def test_the_thread_plans_are_the_ones_the_checks_judge_even_on_one_core():
    plans = {"1 slot x 4 threads": (1, 4), "4 slots x 1 thread (the default)": (4, 1), "4 slots x 4 threads": (4, 4)}
    assert PLANS.threads == plans
    assert list(fastapi_bench.CorePlans("cpu", cores=1).threads.values())[2] == (2, 1)  # crowded: still two slots
    runs = {name: plan_run(name, 20 + i, 50 - i) for i, name in enumerate(PLANS.threads)}
    for check in (fastapi_bench.crowded_threads_are_slower, fastapi_bench.every_core_serves_one_faster):
        assert check(runs, PLANS, "4 cores").outcome is not Outcome.NOT_CHECKED  # each finds the runs it judges
    assert fastapi_bench.default_near_the_best(runs, runs, PLANS, 22.0, "4 cores").conditions


def test_the_plans_are_for_the_cores_this_process_may_use_unless_given():
    assert fastapi_bench.CorePlans("cpu").cores == machine_cores()
    assert fastapi_bench.CorePlans("cpu", cores=3).service.processes == 1  # two cores a process on a CPU


def test_on_a_gpu_the_thread_plans_are_not_run_and_the_notebook_says_why():
    assert "may use 4 core(s): 3 thread plans" in PLANS.describe()
    on_a_gpu = fastapi_bench.CorePlans("cuda:0", cores=48)
    assert on_a_gpu.threads == {} and on_a_gpu.service.processes == 4
    said = on_a_gpu.describe()
    assert said.startswith("The model runs on cuda:0") and "the thread plans are not run" in said


def gpu_run(*utils_by_gpu: list[float], throughput_rps: float = 400.0, source: str = "nvml"):
    gpu = {"name": "Tesla P100-PCIE-16GB", "memory_used_mib": [900.0], "memory_total_mib": 16280.0}
    gpus = [{**gpu, "index": index, "util_percent": utils} for index, utils in enumerate(utils_by_gpu)]
    series = {"t_s": [0.25, 0.5], "cpu_percent": [60.0, 70.0], "memory_percent": [10.0, 10.0], "gpu_source": source}
    series["gpus"] = gpus
    return synthetic_run("fastapi_onnx", 16, throughput_rps, 40.0, resources=series)


def test_on_a_gpu_the_gpu_with_time_to_spare_holds_and_a_gpu_kept_busy_fails_with_its_reason():
    held = fastapi_bench.gpu_has_time_to_spare(gpu_run([30.0, 50.0], [10.0, 10.0]), "cuda (Tesla P100-PCIE-16GB)")
    assert outcomes(held) == [Outcome.HELD] and held.conditions[0].detail == "40% busy"
    assert held.estimate is not None and held.estimate.value == 40.0  # the busiest GPU's mean: the number asked
    busy = fastapi_bench.gpu_has_time_to_spare(gpu_run([95.0, 97.0]), "cuda (Tesla P100-PCIE-16GB)")
    assert outcomes(busy) == [Outcome.NOT_HELD]
    assert busy.reason.startswith("at 400 req/s, the busiest GPU ran a kernel 96% of the time, 2.40 ms per request")


def test_the_gpu_check_is_not_checked_where_the_model_ran_on_the_cpu_or_no_gpu_was_read():
    on_cpu = fastapi_bench.gpu_has_time_to_spare(gpu_run([0.0]), "cpu")
    assert outcomes(on_cpu) == [Outcome.NOT_CHECKED] and "ran its model on cpu" in on_cpu.conditions[0].detail
    unread = fastapi_bench.gpu_has_time_to_spare(gpu_run(source="no GPU found"), "cuda (Tesla P100-PCIE-16GB)")
    assert outcomes(unread) == [Outcome.NOT_CHECKED] and "no GPU found" in unread.conditions[0].detail


def test_on_a_gpu_plan_the_notebook_asks_no_thread_question_and_on_a_cpu_no_gpu_one():
    """Notebook 4 on a GPU: what it prints asks the GPU's use, never the thread plans (their
    predictions, Question 2, the slots x threads plot); on a CPU, the other way round."""
    on_a_gpu = fastapi_bench.CorePlans("cuda (Tesla P100-PCIE-16GB)", cores=48)
    said = on_a_gpu.describe() + "\n" + on_a_gpu.questions()
    assert "predict where a cell says 'On a GPU'" in said and "leave the cells that say 'On a CPU'" in said
    assert "How busy was the GPU" in said and "the latency and resources plots" in said
    assert "thread plan served" not in said and "slots x threads" not in said
    on_a_cpu = PLANS.describe() + "\n" + PLANS.questions()
    assert "Predict them where a cell says 'On a CPU'" in on_a_cpu and "Which thread plan served worst" in on_a_cpu
    assert "slots x threads plot" in on_a_cpu and "How busy was the GPU" not in on_a_cpu


def test_notebook_4_on_a_gpu_runs_no_thread_plan_cell_and_its_time_counts_none():
    """The cells of notebook 4 that set a thread plan's prediction, serve the plans or draw their plot
    are its CPU-only cells (the time plan leaves them out on the GPU node); its GPU prediction's cell
    is GPU-only; each thread check is recorded only where the plans ran, the GPU's only where none did."""
    from servelab import time_plan

    source = (paths.REPO_ROOT / "notebooks" / "4_fastapi_bench.py").read_text()
    thread_work = (
        "predicted_crowded_rate",
        "predicted_every_core",
        "predicted_default_share",
        'lab.measurer.fastapi_variant("pt", slots, threads)',
        'slots x threads per inference")',
    )
    on_gpu, on_cpu = time_plan.code_cells(source, time_plan.GPU), time_plan.code_cells(source, time_plan.CPU)
    assert not [work for work in thread_work if any(work in cell for cell in on_gpu)]
    assert all(any(work in cell for cell in on_cpu) for work in thread_work)
    assert any("predicted_gpu_use = None" in cell for cell in on_gpu)
    assert not any("predicted_gpu_use" in cell for cell in on_cpu)
    records = [cell for cell in time_plan.code_cells(source) if "fastapi_bench.crowded_threads_are_slower" in cell]
    assert len(records) == 1 and records[0].lstrip().startswith("if plans.threads:")
    (gpu_record,) = [cell for cell in on_gpu if "gpu_has_time_to_spare" in cell]
    assert gpu_record.lstrip().startswith("if not plans.threads:")
    assert time_plan.count_steps(source, time_plan.GPU)[1] == time_plan.count_steps(source, time_plan.CPU)[1] - 2
