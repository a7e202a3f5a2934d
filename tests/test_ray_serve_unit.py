"""Ray Serve's side of the lab without a Ray: a step load and its steps, Serve's metrics and the time
in the replica read from them, a config Serve would misread refused (the app on a real Ray:
tests/test_ray_serve.py)."""

import math
from pathlib import Path

import pytest
import yaml

from servelab.lab.ray_side import RayServe
from servelab.profiles import profile
from servelab.ray import local as ray_local
from servelab.ray import rest as ray_rest
from servelab.ray.watch import ServeSample, during, in_replica_mean_ms, serve_metrics
from servelab.settings import settings


class StillWatcher:
    """A ServeWatcher's stand-in: its clock moves one second per reading, and it samples nothing."""

    def __init__(self) -> None:
        self.samples: list[ServeSample] = []
        self.failures: dict[str, int] = {}
        self.clock = 0.0

    def __enter__(self) -> "StillWatcher":
        return self

    def __exit__(self, *exc) -> None:
        pass

    def now_s(self) -> float:
        self.clock += 1
        return self.clock


def test_a_step_load_runs_each_step_for_its_length_in_the_profile_s_steps_while_serve_is_watched(monkeypatch, capsys):
    serve = RayServe("http://127.0.0.1:9", "http://127.0.0.1:8", "http://127.0.0.1:7/metrics", Path("token"), 9)
    monkeypatch.setattr(serve, "watch", StillWatcher)
    sent = []

    def closed_loop(url, clients, seconds, name):
        sent.append((url, clients, seconds, name))
        return name

    load = serve.step_load(closed_loop, [(1, 0.5), (12, 2)], "ray_serve", {"target_ongoing_requests": 2}, step_s=10)
    assert sent == [
        ("http://127.0.0.1:9", 1, 5.0, "ray_serve, step of 1 client(s)"),
        ("http://127.0.0.1:9", 12, 20.0, "ray_serve, step of 12 client(s)"),
    ]
    assert [(step.start_s, step.end_s, step.clients, step.run) for step in load.steps] == [
        (1, 2, 1, "ray_serve, step of 1 client(s)"),
        (3, 4, 12, "ray_serve, step of 12 client(s)"),
    ]
    assert load.autoscaling == {"target_ongoing_requests": 2}
    assert "Steps of 10 s; 0 samples of Serve's state; polls that failed: none" in capsys.readouterr().out
    sent.clear()
    serve.step_load(closed_loop, [(1, 1)], "ray_serve", {})
    assert sent[0][2] == profile(settings().profile).step_s, "by default a step is the profile's"


def test_serve_metrics_are_summed_for_one_deployment_without_health_checks():
    ours, latency = 'application="food11",deployment="Food11"', "ray_serve_deployment_processing_latency_ms"
    lines = [
        "# TYPE ray_serve_replica_processing_queries gauge",
        f'ray_serve_replica_processing_queries{{{ours},replica="a"}} 2.0',
        f'ray_serve_replica_processing_queries{{{ours},replica="b"}} 1.0',
        'ray_serve_replica_processing_queries{application="other",deployment="Food11",replica="c"} 9.0',
        "# TYPE ray_serve_deployment_queued_queries gauge",
        f'ray_serve_deployment_queued_queries{{{ours},handle="h"}} 4.0',
        f"# TYPE {latency} histogram",
        f'{latency}_sum{{{ours},route="/predict"}} 120.0',
        f'{latency}_count{{{ours},route="/predict"}} 6.0',
        f'{latency}_sum{{{ours},route="/health"}} 5.0',
        f'{latency}_count{{{ours},route="/health"}} 5.0',
    ]
    text = "\n".join(lines) + "\n"
    found = serve_metrics(text, "food11", "Food11")
    assert (found.ongoing, found.queued, found.in_replica_ms_total, found.in_replica_count_total) == (3, 4, 120, 6)


def test_time_in_the_replica_is_read_between_the_first_and_last_sample_of_an_interval():
    def at(t_s, ms_total, count_total):
        return ServeSample(t_s, {"RUNNING": 1}, 0.0, 0.0, ms_total, count_total, 50.0)

    samples = [at(0, 0, 0), at(1, 100, 4), at(2, 400, 10), at(3, 1000, 12), at(4, 1000, 12)]
    assert [sample.t_s for sample in during(samples, 1, 3)] == [1, 2, 3]
    assert in_replica_mean_ms(samples, 1, 3) == pytest.approx((1000 - 100) / (12 - 4))
    assert math.isnan(in_replica_mean_ms(samples, 3, 4))  # nothing served in between
    assert math.isnan(in_replica_mean_ms(samples, 1.5, 2.5))  # one sample: no interval


@pytest.mark.parametrize(
    "edit, complaint",
    [
        (lambda d: d.update(max_ongoing_request=3), "deployment Food11: max_ongoing_request"),
        (lambda d: d["autoscaling_config"].update(target_ongoing=1), "autoscaling_config.target_ongoing"),
        (lambda d: d.update(max_queued_requests="many"), "max_queued_requests"),
    ],
    ids=["misspelt-field", "misspelt-autoscaling-field", "wrong-type"],
)
def test_a_config_serve_would_misread_is_refused_saying_which_field(tmp_path, edit, complaint):
    config = ray_local.read_config()
    edit(config["applications"][0]["deployments"][0])
    (tmp_path / "serve_config.yaml").write_text(yaml.safe_dump(config))
    with pytest.raises(ray_rest.RayConfigError, match="serve_config.yaml") as refused:
        ray_local.read_config(tmp_path / "serve_config.yaml")
    assert complaint in str(refused.value)
