"""Food-11 classifier on Ray Serve: the same app as fastapi_onnx, in replicas Serve scales.

Two limits on the requests at once, both set in serve_config.yaml:
- the *concurrency target*: Serve routes at most `max_ongoing_requests` requests to one replica
  at a time. Requests beyond it wait in front of the replicas (at most `max_queued_requests`;
  past that Serve answers 503), and `autoscaling_config` adds replicas while the requests per
  replica stay above `target_ongoing_requests`, and removes them when the load drops;
- the *predict slots*: inside a replica, PREDICT_CONCURRENCY sets how many inferences run at once
  (in the replica's environment), exactly as in the FastAPI services.

Each replica builds the whole FastAPI app of onnx_service.py (same /predict contract, same error
codes, /health, /metrics): `serve.ingress` is given a builder, which Serve calls in the replica,
so the model is loaded there and never in the process that deploys the app. Its POST /refine is a
StreamingResponse, which Serve streams through its proxy step by step; when the client leaves,
the proxy cancels the request in the replica, the handler is cancelled at its next `await`, and
the stream's steps stop there (servelab/service/refine_api.py).

Run: serve run serve_config.yaml   (from this folder, after `make artifacts`; the GPU node's
Compose service does this). Locally the lab's stack runs it on 127.0.0.1: python -m servelab.ray.local.
"""

import logging
from pathlib import Path

from ray import serve

from servelab.service.settings import ServiceSettings

logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

# Read in every process that imports this module: each replica, with the environment Serve gives it.
SETTINGS = ServiceSettings.at_start_up()
MODEL_PATH = SETTINGS.model_path or Path(__file__).parent / "food11.onnx"


def keep_replica_grpc_on_loopback() -> None:
    """Ray Serve 2.60 starts a gRPC server in every replica (for calls between deployments) on
    every interface ([::]:0), with no setting to change it. Where the lab must stay on 127.0.0.1
    (SERVELAB_LOOPBACK_ONLY=1, set by the local stack), bind it there instead."""
    from ray.serve._private import replica

    bind = replica.add_port_to_grpc_server

    def on_loopback(server, address):
        return bind(server, address.replace("[::]", "127.0.0.1"))

    replica.add_port_to_grpc_server = on_loopback


if SETTINGS.loopback_only:
    keep_replica_grpc_on_loopback()


class SayWhere:
    """Adds which Ray node and which replica answered to every response (X-Ray-Node,
    X-Serve-Replica): how a client sees requests spread over replicas and machines."""

    def __init__(self, app, node: str, replica: str):
        self.app, self.headers = app, [(b"x-ray-node", node.encode()), (b"x-serve-replica", replica.encode())]

    async def __call__(self, scope, receive, send):
        async def send_with_headers(message):
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *self.headers]}
            await send(message)

        await self.app(scope, receive, send_with_headers)


def build_app():
    import ray

    from servelab.service.onnx_service import onnx_app  # imported in the replica, where the model runs

    app = onnx_app(MODEL_PATH, title="Food-11 classifier (ONNX Runtime on Ray Serve)", settings=SETTINGS)
    replica = serve.get_replica_context().replica_id.unique_id
    app.add_middleware(SayWhere, node=ray.get_runtime_context().get_node_id(), replica=replica)
    return app


# Settings come from serve_config.yaml (its `deployments` entry named Food11), not from here.
food11 = serve.deployment(name="Food11")(serve.ingress(build_app)())
app = food11.bind()
