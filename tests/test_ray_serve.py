"""The Ray Serve app on a real one-node Ray, on 127.0.0.1: the FastAPI services' contract, the
concurrency target with its queue and its 503, autoscaling read from Serve's own status, loopback
only. The session's Ray serves them all (tests/lab_servers.py).

Tested elsewhere: that stopping the lab leaves no Ray process behind (tests/test_stack.py, the
`up` test), and a two-node cluster on loopback (notebook 9, whose claim must hold:
`lab.expect(..., must_hold=True)`, which its `lab.verdicts()` enforces)."""

import atexit
import base64
import concurrent.futures
import copy
import dataclasses
import ipaddress
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
import requests
import yaml

from food11 import LABELS
from servelab import loadgen
from servelab.lab.ray_side import RayServe
from servelab.ray import local as ray_local
from servelab.ray import rest as ray_rest
from servelab.ray.watch import ServeWatcher, serve_metrics
from servelab.stack.supervision import LocalStack
from tests.helpers import BAD_REQUESTS, TEST_MAX_REQUEST_BYTES, check_bad_request, make_image_bytes, until

# Small on purpose: two requests per replica, then a queue of three in front, then 503; a second
# replica as soon as the requests per replica stay above one for a second.
MAX_ONGOING, MAX_QUEUED, MAX_REPLICAS = 2, 3, 2


def _test_config(path) -> None:
    config = ray_local.read_config()
    (deployment,) = config["applications"][0]["deployments"]
    deployment.update(
        max_ongoing_requests=MAX_ONGOING,
        max_queued_requests=MAX_QUEUED,
        autoscaling_config={
            "target_ongoing_requests": 1,
            "min_replicas": 1,
            "max_replicas": MAX_REPLICAS,
            "upscale_delay_s": 1,
            "downscale_delay_s": 600,  # no replica leaves during the module
        },
    )
    env = deployment["ray_actor_options"]["runtime_env"]["env_vars"]
    env.update(INFERENCE_THREADS="1", MAX_REQUEST_BYTES=str(TEST_MAX_REQUEST_BYTES))
    path.write_text(yaml.safe_dump(config, sort_keys=False))


@pytest.fixture(scope="module")
def ray_service(ray_serve, tmp_path_factory) -> Iterator["RayService"]:
    """The session's Ray Serve, serving this module's config (through Serve's REST API, as notebook 9
    edits it) for the module's tests, then the shipped config again."""
    work = tmp_path_factory.mktemp("ray")
    _test_config(work / "serve_config.yaml")
    serve = ray_serve.serve
    serve.apply(ray_local.read_config(work / "serve_config.yaml"), quiet=True)
    try:
        yield RayService(
            serve.url, serve.dashboard, serve.metrics_url, serve.token_file, ray_serve.stack, work / "serve_config.yaml"
        )
    finally:
        serve.restore()


@dataclass
class RayService:
    url: str
    dashboard: str
    metrics: str
    token_file: Path
    stack: LocalStack
    config: Path  # the config it serves

    def watcher(self) -> ServeWatcher:
        return ServeWatcher(self.dashboard, self.metrics, "food11", "Food11", self.token_file, interval_s=0.5)


def _replicas(service: RayService) -> dict[str, int]:
    """Serve's own count of the replicas in each state, from its REST API."""
    return ray_rest.replicas_by_state(service.dashboard, "food11", "Food11", service.token_file)


def _served(service: RayService) -> float:
    """Requests the replicas have served so far, by Serve's own metrics (reported every second)."""
    return serve_metrics(requests.get(service.metrics, timeout=10).text, "food11", "Food11").in_replica_count_total


def _post(url: str, image_b64: str) -> requests.Response:
    return requests.post(f"{url}/predict", json={"image": image_b64}, timeout=120)


@pytest.mark.integration
def test_predict_has_the_fastapi_contract_and_says_which_replica_answered(ray_service, image_b64):
    url = ray_service.url
    response = _post(url, image_b64)
    assert response.status_code == 200, response.text
    assert set(response.json()) == {"prediction", "probability"}
    assert response.headers["x-ray-node"] and response.headers["x-serve-replica"]
    health = requests.get(f"{url}/health", timeout=10).json()
    assert health["slots"] == 1 and health["inference_threads"] == 1


@pytest.mark.integration
@BAD_REQUESTS
def test_bad_requests_get_the_same_errors_as_from_fastapi(ray_service, image_b64, body, headers, status):
    check_bad_request(ray_service.url, image_b64, body, headers, status)


@pytest.mark.integration
def test_a_body_over_the_limit_is_refused_with_413(ray_service, image_b64):
    url = ray_service.url
    oversized = b'{"image": "' + b"A" * (TEST_MAX_REQUEST_BYTES + 10) + b'"}'
    response = requests.post(f"{url}/predict", data=oversized, headers={"content-type": "application/json"}, timeout=30)
    assert response.status_code == 413 and "MAX_REQUEST_BYTES" in response.json()["detail"]
    assert _post(url, image_b64).status_code == 200


@pytest.mark.integration
def test_load_above_the_target_adds_a_replica_and_serve_s_own_gauges_show_it(ray_service, test_images):
    """Four clients against one replica whose target is one request: Serve's autoscaler, seeing
    four requests per replica for over a second, starts a second replica. Serve's own metrics,
    watched meanwhile, show the requests running in the replicas and the time they spent there."""
    assert _replicas(ray_service) == {"RUNNING": 1}
    with ray_service.watcher() as watcher, concurrent.futures.ThreadPoolExecutor(1) as pool:
        load = pool.submit(
            loadgen.closed_loop,
            loadgen.Endpoint("fastapi", ray_service.url, image_bytes=test_images[1]),
            loadgen.Load(4, duration_s=25),
        )
        result = load.result()
        # A new replica is a process that loads the model: on a busy machine that can outlast the
        # load (seen: asked for under 25 s of it, running after). Only load adds replicas, so one
        # that comes up now was asked for under the load. Waited for in the watcher's own samples,
        # which the gauges below are judged on.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any(sample.running == MAX_REPLICAS for sample in watcher.samples):
            time.sleep(0.5)
    replicas = watcher.samples[-1].replicas if watcher.samples else {}
    assert replicas.get("RUNNING") == MAX_REPLICAS, f"Serve's status after 25 s of load and up to 60 s more: {replicas}"
    # Requests were answered. Some may have been refused (503) although four clients fit in the
    # replicas plus the queue: Serve's router may reject a request while another is between the
    # queue and a replica (ray/serve/_private/router.py says so), and a refused client sends again
    # at once. Refusals are the only failures allowed.
    assert len(result.latencies_ms) > 0 and set(result.errors) <= {"http_503"}, result.errors
    samples = watcher.samples
    assert len(samples) >= 5 and not watcher.failures, watcher.failures
    assert samples[0].running == 1 and max(sample.running for sample in samples) == MAX_REPLICAS
    assert 0 < max(sample.ongoing for sample in samples) <= MAX_REPLICAS * MAX_ONGOING
    served = samples[-1].in_replica_count_total - samples[0].in_replica_count_total
    assert served > 0 and samples[-1].in_replica_ms_total > samples[0].in_replica_ms_total


def _burst(url: str, image_b64: str, clients: int) -> list[tuple[int, float]]:
    """`clients` requests sent at once, each (status, seconds from the send to the answer). Each
    client's connection is opened first (one after another: /health queues like /predict), then all
    send at a barrier. On a busy machine, threads that connected and sent one after another spread
    a burst over longer than a replica takes to answer (seen: all 28 served, 2026-11-28)."""
    sessions = [requests.Session() for _ in range(clients)]
    for session in sessions:
        assert session.get(f"{url}/health", timeout=60).status_code == 200  # the connection, kept alive
    barrier = threading.Barrier(clients)

    def send(session: requests.Session) -> tuple[int, float]:
        barrier.wait(timeout=60)
        started = time.monotonic()
        response = session.post(f"{url}/predict", json={"image": image_b64}, timeout=120)
        return response.status_code, time.monotonic() - started

    try:
        with concurrent.futures.ThreadPoolExecutor(clients) as pool:
            return list(pool.map(send, sessions))
    finally:
        for session in sessions:
            session.close()


@pytest.mark.integration
def test_overload_beyond_the_queue_is_refused_fast_with_503(ray_service, image_b64):
    """More requests at once than the replicas take plus the queue holds: the rest get 503 at
    once, and the server keeps serving."""
    url = ray_service.url
    capacity = MAX_REPLICAS * MAX_ONGOING + MAX_QUEUED
    running = _replicas(ray_service).get("RUNNING", 0)
    answers = _burst(url, image_b64, 4 * capacity)
    codes = [code for code, _ in answers]
    assert set(codes) == {200, 503}, codes
    assert codes.count(200) >= min(running, MAX_REPLICAS) * MAX_ONGOING
    refused = [elapsed for code, elapsed in answers if code == 503]
    served = [elapsed for code, elapsed in answers if code == 200]
    assert max(refused) < max(served), "a refusal must come before the queue it was refused from drains"
    assert _post(url, image_b64).status_code == 200


def _ray_processes(stack: LocalStack) -> list[psutil.Process]:
    leader = psutil.Process(stack.processes[0].process.pid)
    return [leader, *leader.children(recursive=True)]


@pytest.mark.integration
def test_every_ray_process_talks_on_loopback_only(ray_service):
    processes = _ray_processes(ray_service.stack)
    assert any("raylet" in " ".join(p.cmdline()) for p in processes), [p.name() for p in processes]
    seen, elsewhere = 0, []
    for process in processes:
        for connection in process.net_connections(kind="inet"):
            for address in (connection.laddr, connection.raddr):
                if address:
                    seen += 1
                    ip = ipaddress.ip_address(address.ip)
                    ip = getattr(ip, "ipv4_mapped", None) or ip  # ::ffff:127.0.0.1 is 127.0.0.1
                    if not ip.is_loopback:
                        elsewhere.append((process.name(), connection.status, str(address)))
    assert seen > 0 and not elsewhere, elsewhere


@pytest.mark.integration
def test_serves_rest_api_refuses_a_client_without_the_token(ray_service):
    """Ray's dashboard runs code on request: without this launch's token, nothing."""
    url = f"{ray_service.dashboard}/api/serve/applications/"
    assert requests.get(url, timeout=10).status_code == 401
    assert requests.get(url, headers={"Authorization": "Bearer not-the-token"}, timeout=10).status_code == 403


@pytest.mark.integration
def test_a_replica_that_dies_is_replaced_and_the_run_counts_what_failed(ray_service, test_images):
    """Kill a replica in the middle of a load: the run ends on time, counting each request that
    failed, and Serve starts a replica in its place."""
    url = ray_service.url
    replicas = [p for p in _ray_processes(ray_service.stack) if p.name().startswith("ray::ServeReplica")]
    assert replicas, "no replica process found"
    served_before = _served(ray_service)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        load = pool.submit(
            loadgen.closed_loop,
            loadgen.Endpoint("fastapi", url, image_bytes=test_images[2]),
            loadgen.Load(2, duration_s=12),
        )
        # In the middle of the load: once Serve's own metrics count requests served under it.
        until(lambda: _served(ray_service) >= served_before + 4, 30, "requests served under the load")
        replicas[0].kill()
        started = time.monotonic()
        result = load.result(timeout=120)
    assert time.monotonic() - started < 60, "the run must end, not hang on the dead replica"
    assert len(result.latencies_ms) > 0  # the other replica (or the new one) kept answering
    assert set(result.errors) <= {"http_500", "http_502", "http_503", "connection"}, result.errors
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and _replicas(ray_service).get("RUNNING", 0) < len(replicas):
        time.sleep(1)
    assert _replicas(ray_service).get("RUNNING", 0) >= len(replicas)
    assert _post(url, base64.b64encode(test_images[2]).decode()).status_code == 200


@pytest.mark.integration
def test_an_edited_config_is_deployed_and_awaited_through_serve_s_rest_api(ray_service, image_b64):
    """What notebook 9 does to edit the concurrency target: the edit reaches Serve (its own
    account of the deployed config says so) before `apply` returns, and the app keeps serving."""
    port = int(ray_service.url.rsplit(":", 1)[1])
    serve = RayServe(ray_service.url, ray_service.dashboard, ray_service.metrics, ray_service.token_file, port)
    config = ray_local.read_config(ray_service.config)
    as_tested = copy.deepcopy(config)
    serve.deployment_options(config)["max_queued_requests"] = MAX_QUEUED + 7
    with pytest.raises(ray_rest.RayConfigError, match="max_queue_request"):
        broken = copy.deepcopy(config)
        serve.deployment_options(broken)["max_queue_request"] = 1
        serve.apply(broken)
    serve.apply(config, quiet=True)
    deployed = ray_rest.applications(ray_service.dashboard, ray_service.token_file)["food11"]["deployed_app_config"]
    assert deployed["deployments"][0]["max_queued_requests"] == MAX_QUEUED + 7
    answer = serve.predict()  # the sample photo, as notebook 9's first request sends it
    assert answer.status_code == 200 and set(answer.json()) == {"prediction", "probability"}, answer.text
    assert answer.headers["x-serve-replica"]
    serve.apply(as_tested, quiet=True)  # the other tests count on the module's queue
    deployed = ray_rest.applications(ray_service.dashboard, ray_service.token_file)["food11"]["deployed_app_config"]
    assert deployed["deployments"][0]["max_queued_requests"] == MAX_QUEUED


@pytest.mark.integration
def test_a_notebook_done_with_serve_puts_back_one_that_outlives_it_once_and_leaves_its_own(ray_service, monkeypatch):
    """`Lab.stop()` releases Serve: `make up`'s (or the Compose project's) goes back as shipped then,
    and not again at the kernel's exit; one the notebook started is stopped with it, not redeployed."""
    port = int(ray_service.url.rsplit(":", 1)[1])
    where = (ray_service.url, ray_service.dashboard, ray_service.metrics, ray_service.token_file, port)
    taken_off_atexit = []
    monkeypatch.setattr(atexit, "unregister", taken_off_atexit.append)  # what would run at the kernel's exit

    def queue_limit() -> int:
        deployed = ray_rest.applications(ray_service.dashboard, ray_service.token_file)["food11"]
        return deployed["deployed_app_config"]["deployments"][0]["max_queued_requests"]

    started_here = RayServe(*where, outlives_the_notebook=False)
    started_here.release()
    assert queue_limit() == MAX_QUEUED, "the module's config stays: a Serve started by the notebook stops with it"
    assert taken_off_atexit == []
    make_ups = RayServe(*where)
    shipped_limit = make_ups.deployment_options(make_ups.served(make_ups.shipped_config()))["max_queued_requests"]
    assert shipped_limit != MAX_QUEUED, "the module's config differs from the shipped one where this test looks"
    try:
        make_ups.release()
        assert queue_limit() == shipped_limit
        assert taken_off_atexit == [make_ups.restore], "put back once: not again at the kernel's exit"
    finally:
        make_ups.apply(ray_local.read_config(ray_service.config), quiet=True)  # the module's config again


@pytest.mark.integration
def test_gourmetgram_classifies_an_upload_through_ray_serve_unchanged(ray_service, gourmetgram, ports):
    """The web UI, configured as for a FastAPI service, works against the Ray Serve app as is."""
    url = gourmetgram("ray_serve", dataclasses.replace(ports, ray_serve=int(ray_service.url.rsplit(":", 1)[1])))
    upload = {"file": ("lunch.jpg", make_image_bytes(4), "image/jpeg")}
    result = requests.post(f"{url}/predict", files=upload, timeout=60)
    assert result.status_code == 200, result.text[-1000:]
    assert re.search(r"<h1>(.*?)</h1>", result.text).group(1) in LABELS
    assert "answered by fastapi in" in result.text
