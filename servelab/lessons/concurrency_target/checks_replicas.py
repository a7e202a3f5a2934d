"""Notebook 9's checks of replicas: whether another adds capacity on this machine (a GPU of its
own, or cores left), and a two-node Ray cluster that spreads them (a claim that must hold).
"""

from __future__ import annotations

import math

from servelab.lessons.expectations import Estimate, Expectation, condition, figure, measured, unless
from servelab.results import RunResult


def gpu_replicas_add_capacity(by_replicas: dict[int, RunResult], gpus: int, cores: int) -> Expectation:
    """The same clients against 1 and 2 replicas, each with a GPU of its own (no autoscaling): the
    second replica serves at least 1.3x what one does. The margin: a second GPU doubles the compute
    at best, and the runs' noise on a shared machine is some 10%, so 1.3x is a gain no noise makes.
    A wrong outcome: about 1x, the GPUs not the limit. NOT CHECKED where Ray has fewer than two GPUs
    (two replicas then share one, each reserving part of it: no second GPU was added), or a run is
    missing."""
    one, two = (figure(by_replicas.get(n), "throughput_rps", f"{n} replica(s)") for n in (1, 2))
    gain = two.value / one.value if one.value else math.nan
    return Expectation(
        "each GPU replica adds capacity",
        (
            unless(
                gpus >= 2,
                f"this Ray has {gpus} GPU(s), which the two replicas share: a second replica adds no GPU",
                condition(
                    "two replicas serve at least 1.3x what one does", gain >= 1.3, one, two, detail=f"{gain:.2f}x"
                ),
            ),
        ),
        reason="the replicas' GPUs may not be the limit: the CPU work around them (decoding, Serve's proxy, "
        f"the load generator) shares {cores} cores",
        estimate=Estimate("the requests per second of 2 replicas over 1", gain, "x"),
    )


def replicas_stop_at_full_cores(
    by_replicas: dict[int, RunResult], cpu_percent: dict[int, float], cores: int
) -> Expectation:
    """On a CPU-only machine, the same clients against 1, 2 and 3 replicas (`cpu_percent`: the
    machine's CPU use during each run, in % of all cores). Full cores read 95%, not 100: the samples
    are means over a run, which starts and ends with the cores less busy; the third replica's gain
    may exceed what the cores have left by 15%, the runs' noise on a shared machine. A wrong
    outcome: a third replica that adds 1.5x while two already filled the cores (each replica
    counted as a machine of its own). A condition whose run is missing is NOT CHECKED, with the
    replicas that ran."""
    throughputs = {n: figure(by_replicas.get(n), "throughput_rps", f"{n} replica(s)") for n in (2, 3)}
    cpu = {n: measured(f"CPU % with {n} replicas", cpu_percent.get(n, math.nan), "%") for n in (2, 3)}
    ran = ", ".join(str(n) for n in sorted(by_replicas)) or "none"
    gain = throughputs[3].value / throughputs[2].value if throughputs[2].value else math.nan
    room = 100 / cpu[2].value if cpu[2].value else math.inf
    return Expectation(
        "on a CPU-only machine, replicas stop adding capacity once the cores are full",
        (
            unless(
                2 in by_replicas,
                f"no run with two replicas (replicas run: {ran})",
                condition("with two replicas, the CPU samples read at least 95%", cpu[2].value >= 95, cpu[2]),
            ),
            unless(
                2 in by_replicas and 3 in by_replicas,
                f"no run with two and three replicas to compare (replicas run: {ran})",
                condition(
                    "the third replica's gain stays within 100% / (CPU % with two), +15%",
                    gain <= 1.15 * room,
                    throughputs[2],
                    throughputs[3],
                    cpu[2],
                    detail=f"gain {gain:.2f}x, room for {room:.2f}x",
                ),
            ),
        ),
        reason=f"the CPU samples are the whole machine's ({cores} cores): if Serve's proxy or the load generator "
        "spends less CPU per request when fewer requests wait in front, that shows up as capacity",
        estimate=Estimate("the requests per second of 3 replicas over 2", gain, "x"),
    )


def replicas_add_capacity(
    by_replicas: dict[int, RunResult], cpu_percent: dict[int, float], gpus: int, cores: int
) -> Expectation:
    """Replicas add capacity only while the machine has room for them: with GPUs,
    `gpu_replicas_add_capacity`; on a CPU-only machine, `replicas_stop_at_full_cores`."""
    if gpus:
        return gpu_replicas_add_capacity(by_replicas, gpus, cores)
    return replicas_stop_at_full_cores(by_replicas, cpu_percent, cores)


def spread_over_nodes(report: dict, requests: int) -> Expectation:
    """A two-node Ray cluster on this machine (`report`: servelab.ray.cluster's JSON), a deployment
    of two replicas at most one per node, and `requests` requests through the head node's proxy.
    A claim about what the lab's software does, not about speed: it must hold. A wrong outcome:
    both replicas on the head node, which then serves every request. One replica per node and each
    node serving are NOT CHECKED where the cluster had fewer than two nodes (its first condition
    says so)."""
    nodes = report["nodes"]
    replicas = {node: len(report["replicas_by_node"].get(node, [])) for node in nodes}
    served = {node: report["requests_by_node"].get(node, 0) for node in nodes}
    lone = f"the cluster had {len(nodes)} node(s): no second node to place a replica on, nor to serve"
    elsewhere = set(report["node_addresses"]) - {"127.0.0.1"}
    return Expectation(
        "Serve spreads the replicas over both nodes, on loopback, and both serve requests",
        (
            condition("the cluster has two nodes", len(nodes) == 2, measured("nodes", len(nodes))),
            condition(
                "every node is on 127.0.0.1 (Ray kept on loopback)",
                not elsewhere and bool(report["node_addresses"]),
                measured("node addresses other than 127.0.0.1", len(elsewhere)),
                detail=", ".join(report["node_addresses"]),
            ),
            unless(
                len(nodes) >= 2,
                lone,
                condition(
                    "no node holds two replicas: one on each",
                    all(count == 1 for count in replicas.values()),
                    *(measured(f"replicas on node {node[:8]}", count) for node, count in replicas.items()),
                ),
            ),
            condition(
                "every request was answered",
                report["statuses"] == {"200": requests},
                measured("answered", report["statuses"].get("200", 0)),
                detail=f"of {requests}; statuses {report['statuses']}",
            ),
            unless(
                len(nodes) >= 2,
                lone,
                condition(
                    "each node served requests",
                    min(served.values(), default=0) > 0,
                    *(measured(f"served by node {node[:8]}", count) for node, count in served.items()),
                ),
            ),
        ),
        reason=f"the cluster's nodes: {len(nodes)}, at {', '.join(report['node_addresses']) or 'no address'}",
        must_hold=True,
    )
