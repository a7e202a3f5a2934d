"""The in-process ceiling: the same work as a service, in one process, for each thread plan."""

import psutil
import pytest

from servelab.measure.ceilings import sweep, sweep_points
from servelab.measure.inprocess import Point, PointProcess, decoding_threads
from servelab.results import RunResult
from servelab.service.cores import available_cores, thread_plan


def measure_point(runtime: str, point: Point, duration_s: float, warmup_s: float, decode: bool = True) -> RunResult:
    """One measurement of `point` in a fresh Python process, as the sweep makes each."""
    with PointProcess(runtime, point, decode) as process:
        return process.measure(duration_s, warmup_s)


def test_the_sweep_tries_every_core_busy_in_one_slot_or_spread_and_threads_for_one_in_flight():
    assert sweep_points(2, pipelined=True) == [Point(1, 2, True), Point(2, 1, True)]
    several = Point(2, 1, True, processes=2)  # as a service of two processes runs on 4 cores
    assert sweep_points(4, pipelined=True) == [Point(1, 4, True), Point(2, 2, True), Point(4, 1, True), several]
    assert sweep_points(4, pipelined=False) == [Point(1, 1, False), Point(1, 2, False), Point(1, 4, False)]
    assert sweep_points(1, pipelined=True) == [Point(1, 1, True)]
    # On 16 cores, also as a service of 8 processes runs: 2 slots each, on its 2 cores.
    assert sweep_points(16, pipelined=True)[-1] == Point(2, 1, True, processes=8)
    # On a GPU (the GPU check's): one or two slots with every core decoding, and the service's processes.
    assert sweep_points(16, pipelined=True, device="cuda") == [
        Point(1, 16, True),
        Point(2, 8, True),
        Point(1, 4, True, 4),
    ]
    assert sweep_points(16, pipelined=False, device="cuda") == [Point(1, 16, False)]


def test_a_pipeline_decodes_on_every_core_when_a_gpu_infers():
    """On a CPU the inference threads need the cores, so a slot gets one decoding thread; on a GPU
    decoding is the CPU's work, as in the services: one thread would cap the ceiling."""
    assert decoding_threads("cpu", Point(2, 4, True), cores=8) == 2
    assert decoding_threads("cuda", Point(1, 8, True), cores=8) == 8
    assert decoding_threads("cuda", Point(1, 8, True), decode=False, cores=8) == 1  # nothing to decode
    assert decoding_threads("cuda", Point(1, 8, False), cores=8) == 0  # its one thread decodes


@pytest.mark.integration
@pytest.mark.parametrize("runtime", ["onnxruntime", "pytorch"])
@pytest.mark.parametrize("point", [Point(1, 1, False), Point(2, 1, True)], ids=lambda p: p.name)
def test_a_point_runs_in_its_own_process_and_measures_every_image(built_artifacts, runtime, point):
    result = measure_point(runtime, point, duration_s=1.0, warmup_s=0.3)
    assert result.tool == "in-process" and result.name == f"in-process/{runtime}"
    assert result.requests == len(result.latencies_ms) > 0
    assert result.throughput_rps == pytest.approx(result.requests / result.wall_s)
    assert result.concurrency == (point.slots if point.pipelined else 1)
    assert point.name in result.notes[0] and "decode + inference" in result.notes[0]


def test_the_pytorch_model_is_built_for_fp32_convolutions_as_the_service_builds_it(built_artifacts):
    """TF32 (on by default for cuDNN on Ampere and newer GPUs) would move the answers by ~2e-4. The
    ceiling builds the model as fastapi_pt does (servelab.service.devices.torch_model)."""
    import torch

    from servelab.measure.inprocess import load_model

    before = torch.backends.cudnn.allow_tf32
    try:
        torch.backends.cudnn.allow_tf32 = True
        _, placement = load_model("pytorch", thread_plan(slots=1, threads=1, given_by="the test"))
        assert torch.backends.cudnn.allow_tf32 is False
    finally:
        torch.backends.cudnn.allow_tf32 = before
    assert placement.first_inference_ms is not None  # proved by one inference, as in the services


@pytest.mark.integration
def test_inference_only_skips_the_decoding(built_artifacts):
    result = measure_point("onnxruntime", Point(1, 1, False), duration_s=1.0, warmup_s=0.3, decode=False)
    assert result.name == "in-process/onnxruntime (inference only)" and "inference only" in result.notes[0]


@pytest.mark.integration
@pytest.mark.parametrize("runtime", ["onnxruntime", "pytorch"])
def test_a_ceiling_asked_for_a_gpu_it_cannot_use_says_it_ran_on_the_cpu(built_artifacts, runtime, monkeypatch):
    """As in the services: INFERENCE_DEVICE=cuda where no GPU is visible (even on a GPU machine)."""
    monkeypatch.setenv("INFERENCE_DEVICE", "cuda")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    result = measure_point(runtime, Point(1, 1, False), duration_s=0.5, warmup_s=0.2)
    assert "(on cpu (" in result.notes[0] and "INSTEAD OF THE GPU ASKED FOR (cuda)" in result.notes[0]
    asked = "onnxruntime" if runtime == "onnxruntime" else "torch"
    assert result.notes[1].startswith(f"Asked {asked} for the GPU (cuda); it runs on the CPU instead. Its reason: ")


@pytest.mark.integration
def test_the_winning_plan_is_measured_again_in_the_process_that_swept_it_and_the_others_end(built_artifacts):
    ceiling = sweep("onnxruntime", pipelined=False, duration_s=0.5, warmup_s=0.2)
    try:
        assert len(ceiling.points) == len(sweep_points(available_cores(), pipelined=False))
        assert ceiling.best.throughput_rps == max(point.throughput_rps for point in ceiling.points)
        (kept,) = [psutil.Process(process.pid) for process in ceiling.process.processes]
        swept = [
            child for child in psutil.Process().children() if "servelab.measure.inprocess" in " ".join(child.cmdline())
        ]
        assert swept == [kept], "only the winner's process is left"
        again = [ceiling.measure_now(0.3, 0.1) for _ in range(2)]
        assert all(run.requests > 0 and ceiling.plan.name in run.notes[0] for run in again)
        assert ceiling.points[-2:] == again and kept.is_running()
    finally:
        ceiling.close()
    assert not kept.is_running() or kept.status() == psutil.STATUS_ZOMBIE


@pytest.mark.integration
def test_a_point_of_several_processes_runs_them_at_once_and_adds_their_figures_up(built_artifacts):
    point = Point(1, 1, True, processes=2)
    with PointProcess("onnxruntime", point) as process:
        pids = [psutil.Process(child.pid) for child in process.processes]
        result = process.measure(1.0, 0.3)
    assert len({pid.pid for pid in pids}) == 2
    assert result.requests == len(result.latencies_ms) > 0 and result.concurrency == 2
    assert "2 processes at once, their figures added up" in result.notes[0] and point.name in result.notes[0]
    # Each measured for its own 1 s window, at once: the sum of two rates, not one rate over 2 s.
    assert result.throughput_rps == pytest.approx(result.requests / result.wall_s, rel=0.25)
