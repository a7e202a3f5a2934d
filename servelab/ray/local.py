"""Run the Ray Serve app (ray_serve/) on this machine, on 127.0.0.1 only, until stopped.

    python -m servelab.ray.local --port 8500 --dashboard-port 8501 --metrics-port 8502 [--config FILE]

It starts a one-node Ray with the cores this process may use and deploys the config (Ray Serve's
own config-file format) through Serve's REST API, as `serve deploy` does on a real cluster. The
app answers on --port, through Serve's HTTP proxy; Ray's dashboard on --dashboard-port has
Serve's REST API (`GET /api/serve/applications/`: each deployment's replicas, their states and
nodes; `PUT` the same path with an edited config to redeploy); Ray's Prometheus metrics, Serve's
among them, are on --metrics-port. On SIGTERM or Ctrl-C it shuts Serve and Ray down, so no Ray
process outlives it.

The config is written for the GPU node. Served here, it is adapted (and the difference printed):
Serve's proxy on 127.0.0.1 and the lab's port, each replica's GPU replaced by a share of the
cores (the cores divided by `max_replicas`), so the replicas all fit, and, unless the config sets
INFERENCE_THREADS, a replica's inferences get as many threads as it reserved cores.

Ray on Linux advertises the machine's network address and connects to it even when told
127.0.0.1. RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 in the environment of every Ray process keeps it
on loopback (see ENVIRONMENT.md); `ray_environment()` is set before Ray starts, and every Ray
process inherits it.

Ray 2.60 protects its dashboard and Serve's REST API with a token. Each launch makes a new one,
in a file only this user can read (--token-file, by default .lab/ray/auth_token), instead of
Ray's default ~/.ray/auth_token outside the lab; a client reads it (servelab.ray.rest).
"""

from __future__ import annotations

import argparse
import copy
import difflib
import logging
import os
import secrets
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import yaml

from servelab import paths
from servelab.ray.rest import TOKEN_FILE, RayConfigError, deploy
from servelab.service.cores import available_cores
from servelab.service.hardware import Hardware
from servelab.service.serve_config import for_hardware

log = logging.getLogger(__name__)

CONFIG_PATH = paths.RAY_SERVE_DIR / "serve_config.yaml"
# RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 keeps Ray's own processes on loopback (see the module's
# docstring); SERVELAB_LOOPBACK_ONLY=1 makes ray_serve/app.py bind each replica's gRPC server to
# 127.0.0.1 (Ray binds it to every interface, with no setting).
LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "SERVELAB_LOOPBACK_ONLY": "1"}


def ray_environment(token_file: Path) -> dict[str, str]:
    """What every Ray process's environment needs here: loopback only, the token in
    `token_file`, and the app's folder on the import path (replicas import app.py from it)."""
    python_path = os.pathsep.join(filter(None, [str(paths.RAY_SERVE_DIR), os.environ.get("PYTHONPATH")]))
    return {**LOOPBACK_ENV, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token_file), "PYTHONPATH": python_path}


def new_token(token_file: Path) -> None:
    """A fresh random token in `token_file`, readable by this user only."""
    token_file.parent.mkdir(parents=True, exist_ok=True)
    token_file.unlink(missing_ok=True)
    descriptor = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as file:
        file.write(secrets.token_hex(32))


def unknown_fields(config: dict[str, Any]) -> list[str]:
    """Fields Serve's schema does not know, where it would ignore them without a word (a misspelt
    `max_ongoing_request` would leave the default in place)."""
    from ray.serve.config import AutoscalingConfig
    from ray.serve.schema import DeploymentSchema, RayActorOptionsSchema, ServeApplicationSchema, ServeDeploySchema

    def unknown(where: str, given: dict | None, schema) -> list[str]:
        return [f"{where}{key}" for key in (given or {}) if key not in schema.model_fields]

    found = unknown("", config, ServeDeploySchema)
    for application in config.get("applications") or []:
        found += unknown(f"application {application.get('name')}: ", application, ServeApplicationSchema)
        for deployment in application.get("deployments") or []:
            where = f"deployment {deployment.get('name')}: "
            found += unknown(where, deployment, DeploymentSchema)
            found += unknown(f"{where}ray_actor_options.", deployment.get("ray_actor_options"), RayActorOptionsSchema)
            found += unknown(f"{where}autoscaling_config.", deployment.get("autoscaling_config"), AutoscalingConfig)
    return found


def read_config(path: Path = CONFIG_PATH) -> dict[str, Any]:
    """The config as a dict, checked against Serve's own schema, unknown fields included."""
    try:
        config = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise RayConfigError(f"{path} does not exist: give the path of a Ray Serve config file.") from None
    except yaml.YAMLError as exc:  # the text says which line
        raise RayConfigError(f"{path}: not a valid Ray Serve config; fix this and start again:\n{exc}") from None
    return check_config(config, str(path))


def check_config(config: Any, origin: str) -> dict[str, Any]:
    """`config` (from `origin`, for the message) if Serve's schema takes it, unknown fields included."""
    from pydantic import ValidationError
    from ray.serve.schema import ServeDeploySchema

    try:
        ServeDeploySchema.model_validate(config)
    except ValidationError as exc:  # the text says which field
        raise RayConfigError(f"{origin}: not a valid Ray Serve config; fix this and start again:\n{exc}") from None
    unknown = unknown_fields(config)
    if unknown:
        raise RayConfigError(
            f"{origin}: Ray Serve does not know {', '.join(unknown)} (misspelt?); it would ignore them. "
            "The fields are those of Serve's config file: https://docs.ray.io/en/latest/serve/production-guide/config.html"
        )
    return config


def adapt_for_local(config: dict[str, Any], port: int, cores: int) -> dict[str, Any]:
    """The config served on this machine (see the module's docstring). The lab's own ONNX Runtime
    is the CPU build, so a replica's GPU always becomes a share of the cores here."""
    local = for_hardware(config, Hardware(gpus=0, cores=cores))
    if local is config:
        local = copy.deepcopy(config)
    local["http_options"] = {**local.get("http_options", {}), "host": "127.0.0.1", "port": port}
    return local


def config_diff(before: dict, after: dict) -> str:
    def lines(config: dict) -> list[str]:
        return yaml.safe_dump(config, sort_keys=False).splitlines()

    return "\n".join(
        difflib.unified_diff(lines(before), lines(after), "serve_config.yaml", "served on this machine", lineterm="")
    )


def run(config_path: Path, port: int, dashboard_port: int, metrics_port: int, token_file: Path) -> None:
    new_token(token_file)
    os.environ.update(ray_environment(token_file))
    import ray
    from ray import serve

    cores = available_cores()
    shipped = read_config(config_path)
    config = adapt_for_local(shipped, port, cores)
    log.info("Ray Serve config %s, adapted for this machine:\n%s", config_path, config_diff(shipped, config))
    ray.init(
        num_cpus=cores,
        include_dashboard=True,  # Serve's REST API: deploys and status, as on a real cluster
        dashboard_host="127.0.0.1",
        dashboard_port=dashboard_port,
        configure_logging=False,
        # Ray's Prometheus metrics, Serve's among them (requests ongoing in each replica, queued in
        # front of them, time in the replica), every second instead of every ten.
        _metrics_export_port=metrics_port,
        _system_config={"metrics_report_interval_ms": 1000},
    )
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        serve.start(http_options=config["http_options"], proxy_location=config.get("proxy_location", "HeadOnly"))
        deploy(f"http://127.0.0.1:{dashboard_port}", config, token_file)
        log.info("Ray Serve is deploying %s; Serve's proxy: 127.0.0.1:%d", config_path.name, port)
        stop.wait()
    finally:
        log.info("stopping Ray Serve and Ray")
        stop_serve_and_ray()


def stop_serve_and_ray() -> None:
    """Delete every Serve application (its replicas drain and stop), then disconnect from Ray: a
    Ray this process started stops then, Serve's controller and proxy with it (a test cluster
    stops when its own shutdown is called). Not `serve.shutdown()`: in Ray 2.60 its call to the
    controller sometimes outlives the controller, and then waits out its own 30 s timeout
    (seen on a 2-core machine: the raylet retries the call on the controller it had just killed)."""
    import ray
    from ray import serve

    try:
        for name in serve.status().applications:
            serve.delete(name)
    finally:
        ray.shutdown()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True, help="Serve's HTTP proxy, on 127.0.0.1")
    parser.add_argument("--dashboard-port", type=int, required=True, help="Ray's dashboard and Serve's REST API")
    parser.add_argument("--metrics-port", type=int, required=True, help="Ray's Prometheus metrics, Serve's included")
    parser.add_argument("--config", type=Path, default=CONFIG_PATH)
    parser.add_argument("--token-file", type=Path, default=TOKEN_FILE, help="where this launch's token goes")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        run(args.config, args.port, args.dashboard_port, args.metrics_port, args.token_file)
    except RayConfigError as exc:
        log.error("%s", exc)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
