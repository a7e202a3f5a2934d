"""The machinery of notebook 4's cells (servelab.lessons.fastapi_bench): the API's description, the
ports a process listens on, the load watch and what it saw (the checks and the thread plans:
tests/test_lessons_fastapi_bench.py)."""

import os
import socket
import time

import matplotlib.pyplot as plt

from servelab.lessons import fastapi_bench
from servelab.lessons.expectations import machine_cores

OPENAPI = {
    "paths": {
        "/predict": {
            "post": {
                "requestBody": {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Req"}}}},
                "responses": {
                    "200": {
                        "description": "Successful Response",
                        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Resp"}}},
                    },
                    "413": {"description": "Too large"},
                },
            }
        }
    },
    "components": {
        "schemas": {
            "Req": {"properties": {"image": {"type": "string"}}},
            "Resp": {"properties": {"prediction": {}, "probability": {}}},
        }
    },
}


def test_describe_predict_follows_each_reference_to_the_schema_it_names():
    text = fastapi_bench.describe_predict(OPENAPI)
    assert '"image": {\n      "type": "string"' in text  # the request body's schema, resolved
    assert "  200: Successful Response (fields: prediction, probability)" in text
    assert "  413: Too large (fields: no body)" in text


def test_listening_pids_finds_this_process_listening_on_a_port():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        assert os.getpid() in fastapi_bench.listening_pids(f"http://127.0.0.1:{port}")
        # A service of the Compose project, by its name: another container, whatever listens here.
        assert fastapi_bench.listening_pids(f"http://fastapi_onnx:{port}") == []


def test_the_load_watch_times_health_before_and_during_the_block():
    calls = iter(range(1000))
    with fastapi_bench.LoadWatch(
        "http://x:1", idle_checks=3, every_s=0.01, time_health=lambda: float(next(calls))
    ) as watch:
        time.sleep(0.1)
    assert watch.idle_ms == [0.0, 1.0, 2.0]
    assert len(watch.loaded_ms) >= 2 and watch.loaded_ms[0] == 3.0
    assert watch.sampler.pids == []  # the server is on another machine (in Docker, its container): this one only
    stopped = len(watch.loaded_ms)
    time.sleep(0.05)
    assert len(watch.loaded_ms) == stopped  # the poller stopped with the block


def test_usage_text_says_the_machine_the_gpu_or_why_none_and_the_server_process():
    series = {
        "t_s": [0.25, 0.5],
        "cpu_percent": [40.0, 60.0],
        "memory_percent": [10.0, 10.0],
        "gpus": [],
        "gpu_source": "no GPU found",
        "process_cpu_percent": [100.0, 300.0],
    }
    text = fastapi_bench.usage_text(series, 4)
    assert "CPU 50.0% of all 4 cores on average (peak 60.0%); GPU: no GPU found" in text
    assert "The server process alone: 200.0% of one core on average, i.e. 50% of all 4 cores" in text
    gpu = {
        "index": 0,
        "name": "H100",
        "util_percent": [30.0, 50.0],
        "memory_used_mib": [1.0, 2.0],
        "memory_total_mib": 80.0,
    }
    with_gpu = fastapi_bench.usage_text({**series, "gpus": [gpu]}, 4)
    assert "GPU: H100 40.0% busy on average (peak 50.0%)" in with_gpu
    assert f"of all {machine_cores()} cores" in fastapi_bench.usage_text(series)  # the cores this process may use


def test_the_load_watch_shows_what_its_sampler_saw_in_words_and_plotted(capsys):
    watch = fastapi_bench.LoadWatch("http://x:1", idle_checks=0, time_health=lambda: 1.0)
    with watch.sampler:
        time.sleep(0.6)  # two samples, one every 0.25 s
    watch.show_resources("fastapi_onnx, c=16")
    assert "The whole machine: CPU" in capsys.readouterr().out
    assert plt.gcf().get_suptitle() == "Resources during fastapi_onnx, c=16"
    plt.close("all")
