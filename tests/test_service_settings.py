"""The services' settings (servelab/service/settings.py): every variable read from one mapping,
its defaults, and a bad value refused with a message that names the variable and says what to set."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from servelab.service import settings as settings_module
from servelab.service.settings import ServiceSettingError, ServiceSettings

# Every variable the services read, and a value that sets it (not its default).
SET = {
    "SERVICE_PROCESSES": "6",
    "PREDICT_CONCURRENCY": "3",
    "INFERENCE_THREADS": "2",
    "INFERENCE_DEVICE": "cpu",
    "PREPROCESS_WORKERS": "4",
    "DECODE_AHEAD": "5",
    "MAX_REQUEST_BYTES": "1000",
    "IMAGE_URL_ALLOWED_HOSTS": "images.example.org, 127.0.0.1:9000",
    "IMAGE_DOWNLOAD_TIMEOUT_S": "2.5",
    "IMAGE_DOWNLOAD_PLACEMENT": "inside_slot",
    "ABANDON_ON_DISCONNECT": "off",
    "FOOD11_MODEL_PATH": "/models/food11.onnx",
    "SERVELAB_LOOPBACK_ONLY": "1",
}


def test_unset_means_the_defaults():
    assert ServiceSettings.from_environ({}) == ServiceSettings()
    defaults = ServiceSettings()
    assert (defaults.device, defaults.download_placement, defaults.abandon_on_disconnect) == (
        "auto",
        "outside_slot",
        True,
    )
    assert defaults.max_request_bytes == 16 * 1024 * 1024 and defaults.allowed_hosts.text == "127.0.0.1:8400"
    assert defaults.model_path is None and not defaults.loopback_only


def test_every_variable_is_read_from_the_mapping_given():
    read = ServiceSettings.from_environ(SET)
    assert (read.processes, read.slots, read.inference_threads, read.device) == (6, 3, 2, "cpu")
    assert (read.preprocess_workers, read.decode_ahead, read.max_request_bytes) == (4, 5, 1000)
    assert read.allowed_hosts.entries == (("images.example.org", None), ("127.0.0.1", 9000))
    assert (read.download_timeout_s, read.download_placement, read.abandon_on_disconnect) == (2.5, "inside_slot", False)
    assert (read.model_path, read.loopback_only) == (Path("/models/food11.onnx"), True)


def test_the_module_documents_every_variable_it_reads():
    documented = set(re.findall(r"^([A-Z][A-Z0-9_]+) ", settings_module.__doc__, re.MULTILINE))
    assert documented == set(SET)


def test_the_thread_plan_says_which_variables_set_it():
    plan = ServiceSettings.from_environ({"PREDICT_CONCURRENCY": "3", "INFERENCE_THREADS": "2"}).thread_plan("cpu")
    assert (plan.slots, plan.threads) == (3, 2)
    assert "set by PREDICT_CONCURRENCY=3, INFERENCE_THREADS=2" in plan.describe()
    assert "(the defaults)" in ServiceSettings().thread_plan("cpu").describe()
    assert ServiceSettings().thread_plan("cuda (H100)").slots == 1


def test_the_decoding_defaults_follow_the_device_and_the_slots():
    default = ServiceSettings()
    cpu = default.thread_plan("cpu")
    assert default.preprocess_workers_for("cpu", cpu) == max(1, cpu.slots // 2)
    assert default.preprocess_workers_for("cuda", default.thread_plan("cuda")) == cpu.cores
    assert default.decode_ahead_for(cpu, 1) == max(2 * cpu.slots, 1)
    assert default.decode_ahead_for(cpu, 99) == 99
    assert ServiceSettings.from_environ({"DECODE_AHEAD": "7"}).decode_ahead_for(cpu, 99) == 7


@pytest.mark.parametrize(
    "variable, value, says",
    [
        ("PREDICT_CONCURRENCY", "many", "is not a whole number; set it to a positive integer"),
        ("PREDICT_CONCURRENCY", "0", "must be at least 1"),
        ("INFERENCE_THREADS", "-2", "must be at least 1"),
        ("INFERENCE_DEVICE", "gpu", "use auto, cuda, cpu"),
        ("PREPROCESS_WORKERS", "1.5", "is not a whole number"),
        ("DECODE_AHEAD", "two", "is not a whole number"),
        ("MAX_REQUEST_BYTES", "16MiB", "is not a whole number"),
        ("IMAGE_URL_ALLOWED_HOSTS", "images.example.org:http", "is not `host` or `host:port`"),
        ("IMAGE_DOWNLOAD_TIMEOUT_S", "soon", "is not a number of seconds: set it above 0"),
        ("IMAGE_DOWNLOAD_TIMEOUT_S", "0", "set it to a number of seconds above 0"),
        ("IMAGE_DOWNLOAD_TIMEOUT_S", "nan", "set it to a number of seconds above 0"),
        ("IMAGE_DOWNLOAD_PLACEMENT", "in_slot", "use outside_slot or inside_slot"),
        ("ABANDON_ON_DISCONNECT", "maybe", "use on or off"),
        ("SERVELAB_LOOPBACK_ONLY", "loopback", "use on or off"),
    ],
)
def test_a_bad_value_is_refused_naming_the_variable_and_what_it_takes(variable, value, says):
    with pytest.raises(ServiceSettingError) as refused:
        ServiceSettings.from_environ({**SET, variable: value})
    message = str(refused.value)
    assert message.startswith(variable) and says in message


def test_at_start_up_a_bad_value_stops_the_process_with_the_message(monkeypatch):
    monkeypatch.setenv("ABANDON_ON_DISCONNECT", "sometimes")
    with pytest.raises(SystemExit, match=r"ABANDON_ON_DISCONNECT='sometimes': use on or off"):
        ServiceSettings.at_start_up()


@pytest.mark.parametrize("on, off", [("on", "off"), ("true", "false"), ("yes", "no"), ("1", "0"), ("ON", "Off")])
def test_a_switch_takes_on_or_off_in_its_usual_spellings(on, off):
    read = ServiceSettings.from_environ({"ABANDON_ON_DISCONNECT": off, "SERVELAB_LOOPBACK_ONLY": on})
    assert read == ServiceSettings(abandon_on_disconnect=False, loopback_only=True)


def test_a_process_of_several_plans_its_threads_on_its_share_of_the_cores(monkeypatch):
    monkeypatch.setattr(settings_module, "available_cores", lambda: 16)
    workers = ServiceSettings.from_environ({"SERVICE_PROCESSES": "4"})
    plan = workers.thread_plan("cpu")
    assert (plan.cores, plan.slots) == (4, 4)  # not the machine's 16: three other processes share them
    assert workers.preprocess_workers_for("cpu", plan) == 2
    assert workers.service_plan("cuda").processes == 4
    assert ServiceSettings().service_plan("cpu").processes == 8  # the plan's own count, on 16 cores
    # A process started alone (plain uvicorn, a Ray replica) has every core.
    alone = ServiceSettings().thread_plan("cpu")
    assert (alone.cores, alone.slots) == (16, 16)
