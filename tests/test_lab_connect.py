"""Lab.connect against the session's real stack, as a notebook finds `make up`'s: a model an
earlier notebook left edited (notebook 6's eight instances, its last cell never run) is served as
shipped again before the next notebook measures it."""

from __future__ import annotations

import os

import pytest
import requests

from servelab import environment, paths
from servelab.lab import Lab, facade, run_keeper
from servelab.lab import connecting as lab_connecting
from servelab.settings import Settings
from servelab.stack import ports as stack_ports
from servelab.triton import server as triton_local
from servelab.triton.models import ModelRepository

MODEL = "food_classifier_onnx"


@pytest.fixture
def connecting(model_servers, tmp_path, monkeypatch):
    """Lab.connect as a notebook's kernel runs it: with the session's ports, which were exported
    after this process first read (and cached) its settings."""
    monkeypatch.setattr(run_keeper, "SAVED_RUNS_DIR", tmp_path / "results")
    fresh = Settings.from_environ(os.environ)
    for module in (facade, lab_connecting, environment, stack_ports):
        monkeypatch.setattr(module, "settings", lambda: fresh)
    return Lab.connect


@pytest.mark.integration
def test_connect_serves_the_shipped_config_of_a_model_an_earlier_notebook_left_edited(connecting, ports, capsys):
    def served() -> dict:
        address = f"http://127.0.0.1:{ports.triton_http}/v2/models/{MODEL}/config"
        return requests.get(address, timeout=10).json()  # Triton's own config endpoint

    earlier = connecting("6_triton_bench")
    assert "Using the lab already running on this machine" in capsys.readouterr().out, "the session's stack"
    shipped = earlier.triton.configs.config(MODEL)
    earlier.triton.configs.apply_config(MODEL, shipped.with_text("instance_group [ { count: 2, kind: KIND_CPU } ]"))
    assert [group["count"] for group in served()["instance_group"]] == [2]
    capsys.readouterr()

    connecting("7_triton_batching")  # the next notebook, its first cell
    said = capsys.readouterr().out
    assert f"{MODEL}: its config.pbtxt is an edit (Triton serves 2 instance(s)), left by an earlier notebook" in said
    config = served()
    assert [(group["count"], group["kind"]) for group in config["instance_group"]] == [(1, "KIND_CPU")]
    assert "dynamic_batching" not in config
    staged = paths.TRITON_DIR / "models" / MODEL
    as_shipped = triton_local.served_config(ModelRepository().get(MODEL), shipped, staged)
    assert (staged / "config.pbtxt").read_text() == as_shipped.text

    # Served as shipped already: the next connect reloads nothing.
    connecting("7_triton_batching")
    assert "back to the config as shipped" not in capsys.readouterr().out
