"""Command line of the lab's tooling.

    python -m servelab artifacts [--checkpoint PATH_OR_URL --sha256 HEX] [--force]
    python -m servelab up [--ui-backend fastapi_pt|fastapi_onnx|<a Triton model that classifies photos>]
    python -m servelab bench [--profile full|quick] [--out DIR]
    python -m servelab loadgen --target fastapi|triton-http|triton-grpc --address ADDRESS ...   (--help)

`make up`, `make artifacts` and `make bench` in the repository root call these inside the lab's
virtualenv.
"""

from __future__ import annotations

import argparse
import logging
import secrets
import signal
import sys
import time

from servelab import paths
from servelab.settings import SettingError, settings
from servelab.stack import artifacts
from servelab.stack.catalogue import DEFAULT_IMAGE_LATENCY_MS, lab_services
from servelab.stack.supervision import LocalStack, Ports, StackError
from servelab.triton.models import ModelError, ModelRepository
from servelab.triton.server import StagingError

log = logging.getLogger("servelab")


def _print_urls(ports: Ports, ui_backend: str, weights_info: dict, jupyter_token: str) -> None:
    local, api = "http://127.0.0.1", "POST /predict, GET /health, /metrics"
    rows = [
        ("JupyterLab (the notebooks)", f"{local}:{ports.jupyter}/lab/tree/student?token={jupyter_token}", ""),
        ("GourmetGram web UI", f"{local}:{ports.gourmetgram}/", f"backend: {ui_backend}"),
        ("FastAPI (PyTorch)", f"{local}:{ports.fastapi_pt}/docs", api),
        ("FastAPI (ONNX Runtime)", f"{local}:{ports.fastapi_onnx}/docs", api),
        ("Triton HTTP (KServe v2)", f"{local}:{ports.triton_http}/v2", ", ".join(ModelRepository().names())),
        ("Triton gRPC", f"127.0.0.1:{ports.triton_grpc}", ""),
        ("Triton metrics", f"{local}:{ports.triton_metrics}/metrics", ""),
        ("Ray Serve (ONNX Runtime)", f"{local}:{ports.ray_serve}/docs", "the FastAPI ONNX app, autoscaled"),
        ("Ray dashboard", f"{local}:{ports.ray_dashboard}/", "Serve's REST API: /api/serve/applications/"),
        ("Ray metrics", f"{local}:{ports.ray_metrics}/metrics", "Prometheus, Serve's included"),
        (
            "Image host (object store)",
            f"{local}:{ports.image_host}/images/soup.jpg",
            f"emulated network: {DEFAULT_IMAGE_LATENCY_MS:g} ms added per download",
        ),
    ]
    width = max(len(name) for name, _, _ in rows)
    lines = [f"  {name:<{width}}  {url:<44} {note}".rstrip() for name, url, note in rows]
    print("\nThe lab is up:\n" + "\n".join(lines), file=sys.stderr)
    if weights_info["weights"] != "trained":
        print(f"\n  NOTE: {weights_info['note']}", file=sys.stderr)
    print(f"\n  Logs: {paths.LOG_DIR}\n  Press Ctrl-C to stop everything.\n", file=sys.stderr, flush=True)


def _stop_on_sigterm(signum, frame) -> None:
    raise KeyboardInterrupt


def up(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m servelab up", description="Start the local serving stack.")
    parser.add_argument(
        "--ui-backend", default="fastapi_pt", help="what GourmetGram calls: fastapi_pt, fastapi_onnx or a Triton model"
    )
    args = parser.parse_args(argv)

    try:
        built = artifacts.ensure_artifacts()
    except artifacts.ArtifactError as exc:
        log.error("%s", exc)
        return 2
    ports = Ports.configured()
    # Ctrl-C, and SIGTERM from a process manager or `kill`, take the same clean path. SIGINT is set
    # explicitly because a shell starts background jobs with it ignored, and Python keeps that.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    # A fresh token each time: the notebooks server runs code, so only whoever sees this output gets in.
    jupyter_token = secrets.token_hex(16)
    try:
        stack = LocalStack(lab_services(ports, jupyter_token, args.ui_backend))
    except (ValueError, ModelError, StagingError) as exc:  # a bad --ui-backend, or a model folder to fix
        log.error("%s", exc)
        return 2
    try:
        stack.events_path.unlink(missing_ok=True)  # the crashes of an earlier `make up`
        stack.start()
        _print_urls(ports, args.ui_backend, built.weights_info, jupyter_token)
        # The stack's supervisor restarts a service that crashes, and says so in this log; a
        # service it gave up on stays down while the others go on serving.
        while True:
            time.sleep(1)
    except StackError as exc:
        log.error("%s", exc)
        return 1
    except KeyboardInterrupt:
        log.info("stopping the lab...")
        return 0
    finally:
        stack.stop()


def _bench(argv: list[str]) -> int:
    from servelab.bench import run as bench  # imports matplotlib and the clients: only when benchmarking

    return bench.main(argv)


def _loadgen(argv: list[str]) -> int:
    from servelab import loadgen

    return loadgen.main(argv)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    argv = sys.argv[1:] if argv is None else argv
    commands = {"artifacts": artifacts.main, "up": up, "bench": _bench, "loadgen": _loadgen}
    if not argv or argv[0] not in commands:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        settings()  # read at start-up: a bad value stops the command before it starts anything
    except SettingError as exc:
        log.error("%s", exc)
        return 2
    return commands[argv[0]](argv[1:])


if __name__ == "__main__":
    sys.exit(main())
