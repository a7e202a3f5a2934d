"""The Compose project's own paths, from its Jupyter container (`make test-docker` runs this file
there, beside notebooks 3 and 5: scripts/test_docker.sh says why those). The other notebooks run in
`make test` against the local stack; what they do differently in the containers (Ray Serve's REST
API and shared volume, perf_analyzer against Triton's container, the image host across the network,
cancels over gRPC counted from Triton's log) is checked here in seconds, not in minutes of lessons.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator

import pytest
import requests

from servelab.lab import Lab
from servelab.lessons import cancellation
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
    if not serve.hardware.gpus:  # the two share the container's cores, as notebook 9's runs do
        food11["ray_actor_options"]["num_cpus"] = int(serve.hardware.cores / 2 * 1000) / 1000
    try:
        serve.apply(config)
        assert serve.replicas() == {"RUNNING": 2}
        with serve.watch() as watcher:
            run = lab.measurer.closed_loop(
                serve.url, 4, 3.0, name="ray_serve, 2 replicas, 4 clients", service_stats=True
            )
        assert run.errors == {} and run.throughput_rps > 0
        assert watcher.samples, "Serve's own figures were read from its container while the run went on"
    finally:
        lab.stop()  # a notebook's last cell: the Compose project's Serve, which outlives it, goes back as shipped
    assert serve.deployed_app() == serve.served(serve.shipped_config())["applications"][0]


def test_perf_analyzer_in_the_jupyter_image_measures_triton_s_container(lab):
    run = lab.triton.perf("food_classifier_onnx", concurrency=2, triton_stats=True)
    assert run is not None and run.throughput_rps > 0 and run.errors == {}
    assert run.command[run.command.index("-u") + 1] == lab.triton_http, "perf_analyzer reached Triton by its name"
    assert run.triton_stats["inference_count"] >= run.requests


def test_instances_typed_for_the_gpu_node_run_on_the_hardware_triton_s_container_has(lab):
    shipped = lab.triton.configs.config("food_classifier_onnx")
    two_gpus = "instance_group [ { count: 1, kind: KIND_GPU, gpus: [ 0 ] }, { count: 1, kind: KIND_GPU, gpus: [ 1 ] } ]"
    try:
        lab.triton.configs.apply_config("food_classifier_onnx", shipped.with_text(two_gpus))
        assert lab.triton.configs.served_instances("food_classifier_onnx") == 2
        served = lab.triton.configs.served_config("food_classifier_onnx")
        kinds = {group["kind"] for group in served["instance_group"]}
        assert kinds == ({"KIND_GPU"} if lab.triton_server.gpus else {"KIND_CPU"}), served["instance_group"]
    finally:
        lab.triton.configs.restore_config("food_classifier_onnx")
    assert lab.triton.configs.served_instances("food_classifier_onnx") == shipped.instance_count()


def test_photos_come_from_the_image_host_by_its_service_name_and_other_hosts_are_refused(lab):
    service = lab.fastapi_url("onnx")
    by_url = requests.post(f"{service}/predict", json={"url": lab.image_url("soup.jpg")}, timeout=30)
    photo = base64.b64encode(lab.sample_image()).decode()
    sent = requests.post(f"{service}/predict", json={"image": photo}, timeout=30)
    assert by_url.status_code == 200 and by_url.json() == sent.json(), (by_url.text, sent.text)
    for url, status in ((f"{service}/health", 403), ("file:///etc/passwd", 400)):
        refused = requests.post(f"{service}/predict", json={"url": url}, timeout=30)
        assert refused.status_code == status, (url, refused.text)
    # A variant of notebook 8's, a process of this container, downloading across the network.
    latency_ms = 50
    with lab.measurer.fastapi_variant("onnx", slots=1, IMAGE_DOWNLOAD_PLACEMENT="outside_slot") as url:
        run = lab.concurrent(
            "onnx",
            4,
            url=url,
            image_url=lab.image_url("soup.jpg", latency_ms=latency_ms),
            name="fastapi_onnx, 1 slot, download outside_slot",
        )
    assert run.errors == {} and run.latencies_ms, run.errors
    assert run.service_stats["stage_mean_ms"]["download"] >= latency_ms, "each download waited out the host's latency"


def test_cancels_reach_triton_s_container_over_grpc_and_its_log_counts_the_steps_of_streams(lab):
    model = "food_classifier_onnx"
    experiment = cancellation.Experiment(lab, patient=2, impatient=4, stream_patient=1, stream_impatient=2)
    one_at_a_time = (
        lab.triton.configs.config(model)
        .with_fields(max_batch_size=1)
        .with_instance_groups([{"count": 1, "kind": "KIND_GPU", "gpus": [0]}])  # a CPU one without a GPU
        .with_dynamic_batching()
    )
    with experiment.triton_config(model, one_at_a_time):
        run = experiment.triton_requests("grpc", model)
    stats = run.triton_stats
    assert run.cancelled > 0, "the impatient clients gave up on requests"
    # Dropped before the model, or answered CANCELLED by it (read from Triton's log in the shared volume).
    never_computed = stats["fail_count"] + stats["cancelled_by_model"]
    assert never_computed > 0, f"no cancel reached Triton: {stats}"
    streams = experiment.stream("Triton", "on")
    steps = streams.steps
    assert streams.cancelled > 0 and steps["computed"] > 0, f"the steps were counted from Triton's log: {steps}"
    assert steps["for_gone_clients"] <= 2 * streams.cancelled, steps
