"""Notebook 9's checks of capacity: replicas against the machine's capacity, replicas over two nodes,
FastAPI's slot; each fed the case it must pass and the cases it must fail (the checks of autoscaling
and queues: tests/test_lessons_concurrency_target.py)."""

import pytest

from servelab.lessons import concurrency_target
from servelab.lessons.expectations import Outcome
from tests.helpers import service_stages, synthetic_run
from tests.helpers.lessons import outcomes


def replicas_runs(*rates):
    return {n: synthetic_run(f"ray_serve, {n} replica(s), 8 clients", 8, rate) for n, rate in enumerate(rates, 1)}


@pytest.mark.parametrize(
    "rates, gpus, outcome, said",
    [
        ((30, 55), 2, Outcome.HELD, "1.83x"),
        ((30, 33), 2, Outcome.NOT_HELD, "1.10x"),  # the GPUs not the limit (the CPU work around them is)
        ((30, 31), 1, Outcome.NOT_CHECKED, "this Ray has 1 GPU(s), which the two replicas share"),
    ],
)
def test_a_second_gpu_replica_is_judged_on_its_gain_where_it_has_a_gpu_of_its_own(rates, gpus, outcome, said):
    judged = concurrency_target.gpu_replicas_add_capacity(replicas_runs(*rates), gpus=gpus, cores=16)
    assert outcomes(judged) == [outcome], judged
    assert judged.conditions[0].detail.startswith(said) and "shares 16 cores" in judged.reason
    assert judged.estimate is not None and judged.estimate.value == rates[1] / rates[0]


def test_replicas_that_stop_adding_once_the_cores_are_full_hold():
    held = concurrency_target.replicas_stop_at_full_cores(replicas_runs(20, 30, 31), {1: 60, 2: 97, 3: 99}, cores=2)
    assert outcomes(held) == [Outcome.HELD] * 2, held
    assert held.conditions[1].detail == "gain 1.03x, room for 1.03x"
    assert held.estimate is not None and held.estimate.value == 31 / 30  # the third replica's gain over two


def test_a_third_replica_that_adds_capacity_past_full_cores_fails():
    """The wrong outcome: each replica counted as a machine of its own, 1.5x from a third replica
    while two already filled the cores; and cores that two replicas left half idle."""
    failed = concurrency_target.replicas_stop_at_full_cores(replicas_runs(20, 30, 45), {1: 60, 2: 97, 3: 99}, cores=2)
    assert outcomes(failed) == [Outcome.HELD, Outcome.NOT_HELD]
    idle = concurrency_target.replicas_stop_at_full_cores(replicas_runs(20, 30, 31), {1: 40, 2: 60, 3: 70}, cores=2)
    assert outcomes(idle)[0] is Outcome.NOT_HELD
    assert "(2 cores)" in idle.reason


def test_the_capacity_check_follows_the_hardware():
    runs = replicas_runs(30, 55, 56)
    assert (
        concurrency_target.replicas_add_capacity(runs, {}, gpus=2, cores=16).claim == "each GPU replica adds capacity"
    )
    cpu_only = concurrency_target.replicas_add_capacity(runs, {1: 60, 2: 97, 3: 99}, gpus=0, cores=2)
    assert cpu_only.claim.startswith("on a CPU-only machine")


def test_replicas_against_cores_without_a_third_run_are_not_checked():
    runs = replicas_runs(20, 30)
    partial = concurrency_target.replicas_stop_at_full_cores(runs, {1: 60, 2: 97}, cores=2)
    assert outcomes(partial) == [Outcome.HELD, Outcome.NOT_CHECKED]
    assert partial.conditions[1].detail == "no run with two and three replicas to compare (replicas run: 1, 2)"


def two_node_report(replicas=None, served=None, nodes=("node-aaaa1", "node-bbbb2"), addresses=("127.0.0.1",), ok=40):
    replicas = replicas or {nodes[0]: ["r1"], nodes[-1]: ["r2"]}
    statuses = {"200": ok, **({"503": 40 - ok} if ok < 40 else {})}
    return {
        "nodes": list(nodes),
        "node_addresses": list(addresses),
        "statuses": statuses,
        "requests_by_node": served or {nodes[0]: 22, nodes[-1]: 18},
        "replicas_by_node": replicas,
    }


def test_replicas_spread_over_two_nodes_on_loopback_hold_every_condition():
    held = concurrency_target.spread_over_nodes(two_node_report(), 40)
    assert outcomes(held) == [Outcome.HELD] * 5, held
    assert held.must_hold


def test_both_replicas_on_the_head_node_fail():
    """The wrong outcome: both replicas on the head node, which then served every request."""
    head = two_node_report(replicas={"node-aaaa1": ["r1", "r2"]}, served={"node-aaaa1": 40})
    failed = concurrency_target.spread_over_nodes(head, 40)
    assert outcomes(failed) == [Outcome.HELD, Outcome.HELD, Outcome.NOT_HELD, Outcome.HELD, Outcome.NOT_HELD]
    assert [item.value for item in failed.conditions[2].figures] == [2, 0]
    exposed = concurrency_target.spread_over_nodes(two_node_report(addresses=("10.0.0.5", "127.0.0.1"), ok=38), 40)
    assert outcomes(exposed) == [Outcome.HELD, Outcome.NOT_HELD, Outcome.HELD, Outcome.NOT_HELD, Outcome.HELD]


def test_a_cluster_whose_second_node_never_joined_leaves_the_placement_not_checked():
    lone = concurrency_target.spread_over_nodes(
        two_node_report(nodes=("node-aaaa1",), replicas={"node-aaaa1": ["r1"]}, served={"node-aaaa1": 40}), 40
    )
    assert outcomes(lone) == [Outcome.NOT_HELD, Outcome.HELD, Outcome.NOT_CHECKED, Outcome.HELD, Outcome.NOT_CHECKED]
    assert lone.conditions[2].detail.startswith("the cluster had 1 node(s): no second node")
    assert "1, at 127.0.0.1" in lone.reason


def fastapi_run(clients, p50_ms, slot_wait_ms, inference_ms, errors=None):
    stages = service_stages(slot_wait=slot_wait_ms, inference=inference_ms)
    name = f"fastapi_onnx, 1 slot, {clients}"
    return synthetic_run(name, clients, 1000 * clients / p50_ms, p50_ms, errors=errors or {}, service_stats=stages)


def test_requests_waiting_for_fastapis_slot_hold_every_condition():
    held = concurrency_target.fastapi_queues_inside(fastapi_run(4, 40, 28, 9), fastapi_run(16, 150, 135, 9.5), 1)
    assert outcomes(held) == [Outcome.HELD] * 3, held
    assert held.conditions[2].detail == "slot wait +107.0 ms, inference +0.5 ms"
    assert (
        held.estimate is not None
        and held.estimate.value == held.conditions[1].figures[1].value / held.conditions[1].figures[0].value
    )


def test_requests_refused_or_waiting_outside_the_slot_fail():
    """The wrong outcome: the extra clients refused, or their wait outside the slot (the latency
    grows while the slot wait stays within an inference time of what it was)."""
    refused = fastapi_run(16, 150, 30, 9, errors={"http_503": 5})
    failed = concurrency_target.fastapi_queues_inside(fastapi_run(4, 40, 28, 9), refused, 1)
    assert outcomes(failed) == [Outcome.NOT_HELD, Outcome.HELD, Outcome.NOT_HELD]
    flat = concurrency_target.fastapi_queues_inside(fastapi_run(4, 40, 28, 9), fastapi_run(16, 80, 30, 9), 1)
    assert outcomes(flat) == [Outcome.HELD, Outcome.NOT_HELD, Outcome.NOT_HELD]


def test_fastapi_with_a_slot_for_every_client_is_not_checked():
    judged = concurrency_target.fastapi_queues_inside(fastapi_run(4, 40, 0, 9), fastapi_run(16, 45, 0, 9), 16)
    assert outcomes(judged) == [Outcome.HELD, Outcome.NOT_CHECKED, Outcome.NOT_CHECKED]
    assert judged.conditions[1].detail == "16 client(s) for 16 predict slot(s): none had to wait for a slot"
