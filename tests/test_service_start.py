"""How the lab starts a FastAPI service (servelab/service/start.py): uvicorn's own command from the
service's folder, with the processes its app plans (`python app.py`) unless WEB_CONCURRENCY is given,
and one fresh metrics folder for several processes."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from servelab import paths
from servelab.service.cores import available_cores, service_plan
from servelab.service.start import planned_processes, service_environment, uvicorn_command


def test_the_command_is_uvicorns_own_on_the_app_of_the_folder_it_runs_in():
    command = [sys.executable, "-m", "uvicorn", "app:app", "--host", "127.0.0.1", "--port", "8101"]
    assert uvicorn_command("127.0.0.1", 8101) == command


def test_the_processes_are_what_the_app_plans_for_this_machine_and_the_labs_own_copy_agrees():
    planned = planned_processes(paths.FASTAPI_ONNX_DIR, "cpu")
    assert planned == service_plan(available_cores(), on_gpu=False).processes >= 1
    assert service_environment(paths.FASTAPI_ONNX_DIR, {"INFERENCE_DEVICE": "cpu"})["WEB_CONCURRENCY"] == str(planned)


def test_a_setting_the_app_cannot_use_stops_its_plan_with_the_apps_own_words():
    with pytest.raises(RuntimeError, match="fastapi_onnx does not start: INFERENCE_DEVICE='gpu' is not one of"):
        planned_processes(paths.FASTAPI_ONNX_DIR, "gpu")


def test_several_processes_get_one_new_empty_metrics_folder_and_one_process_none():
    one = service_environment(paths.FASTAPI_ONNX_DIR, {"WEB_CONCURRENCY": "1"})
    assert one == {"WEB_CONCURRENCY": "1"}
    several = service_environment(paths.FASTAPI_ONNX_DIR, {"WEB_CONCURRENCY": "3", "MAX_REQUEST_BYTES": "9"})
    folder = Path(several["PROMETHEUS_MULTIPROC_DIR"])
    assert folder.is_dir() and not any(folder.iterdir()) and several["MAX_REQUEST_BYTES"] == "9"
    again = service_environment(paths.FASTAPI_ONNX_DIR, {"WEB_CONCURRENCY": "3"})
    assert again["PROMETHEUS_MULTIPROC_DIR"] != str(folder), "each start its own"


def test_the_setting_that_named_the_processes_before_uvicorn_did_is_refused_saying_so():
    with pytest.raises(ValueError, match="WEB_CONCURRENCY"):
        service_environment(paths.FASTAPI_ONNX_DIR, {"SERVICE_PROCESSES": "2"})
