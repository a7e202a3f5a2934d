"""The Compose project's own paths, from its Jupyter container: `make test-docker` runs this file
there, beside notebooks 3, 5, 7 and 9 (scripts/test_docker.sh says why those).

Notebooks 4, 6 and 8 run once, in `make test`, against the local stack; in the containers they
would measure the same lessons again for many minutes. What they do differently there is checked
here in seconds: the lab's client of Ray Serve's own container (its REST API, its token and
hardware in the shared volume) deploying replicas and measuring them, perf_analyzer in the Jupyter
image against Triton's container, and instances changed through the volume both containers share.
Elsewhere (LAB_SERVICES=local) there is no Compose project to reach, and the module says so.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from servelab.lab import Lab
from servelab.settings import settings

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        settings().services != "compose",
        reason="the Compose project's paths, checked from its Jupyter container by `make test-docker`",
    ),
]


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    lab = Lab.connect("compose_check")
    yield lab
    lab.stop()


def test_ray_serve_s_container_runs_the_replicas_a_config_asks_for_and_both_answer(lab):
    serve = lab.ray_serve()
    config = serve.shipped_config()
    food11 = serve.deployment_options(config)
    food11.pop("autoscaling_config")
    food11["num_replicas"] = 2
    if not serve.hardware.gpus:  # the two share the container's cores, as notebook 8's runs do
        food11["ray_actor_options"]["num_cpus"] = int(serve.hardware.cores / 2 * 1000) / 1000
    try:
        serve.apply(config)
        assert serve.replicas() == {"RUNNING": 2}
        with serve.watch() as watcher:
            run = lab.closed_loop(serve.url, 4, 3.0, name="ray_serve, 2 replicas, 4 clients", service_stats=True)
        assert run.errors == {} and run.throughput_rps > 0
        assert watcher.samples, "Serve's own figures were read from its container while the run went on"
    finally:
        serve.restore()
    assert serve.deployed_app() == serve.served(serve.shipped_config())["applications"][0]


def test_perf_analyzer_in_the_jupyter_image_measures_triton_s_container(lab):
    run = lab.triton.perf("food_classifier_onnx", concurrency=2, triton_stats=True)
    assert run is not None and run.throughput_rps > 0 and run.errors == {}
    assert run.command[run.command.index("-u") + 1] == lab.triton_http, "perf_analyzer reached Triton by its name"
    assert run.triton_stats["inference_count"] >= run.requests


def test_instances_typed_for_the_gpu_node_run_on_the_hardware_triton_s_container_has(lab):
    shipped = lab.triton.config("food_classifier_onnx")
    two_gpus = "instance_group [ { count: 1, kind: KIND_GPU, gpus: [ 0 ] }, { count: 1, kind: KIND_GPU, gpus: [ 1 ] } ]"
    try:
        lab.triton.apply_config("food_classifier_onnx", shipped.with_text(two_gpus))
        assert lab.triton.served_instances("food_classifier_onnx") == 2
        served = lab.triton.served_config("food_classifier_onnx")
        kinds = {group["kind"] for group in served["instance_group"]}
        assert kinds == ({"KIND_GPU"} if lab.triton_server.gpus else {"KIND_CPU"}), served["instance_group"]
    finally:
        lab.triton.restore_config("food_classifier_onnx")
    assert lab.triton.served_instances("food_classifier_onnx") == shipped.instance_count()
