"""Food-11 classifier on Ray Serve: fastapi_onnx's app in replicas that Serve routes to and scales.

    serve run serve_config.yaml      (from this folder, after `make artifacts`; the GPU node's container does this)

Two limits on the requests at once, both set in serve_config.yaml:
- the *concurrency target*: Serve routes at most `max_ongoing_requests` requests to one replica at a
  time. Requests beyond it wait in front of the replicas (at most `max_queued_requests`; past that Serve
  answers 503), and `autoscaling_config` adds replicas while the requests per replica stay above
  `target_ongoing_requests`, and removes them when the load drops;
- the *predict slots*: inside a replica, PREDICT_CONCURRENCY (in the replica's environment) sets how
  many inferences run at once, exactly as in fastapi_onnx.

Each replica serves fastapi_onnx/app.py as it is (the same /predict and /refine, errors, /health and
/metrics), built in the replica, where its lifespan loads the model, never in the process that deploys.
When a client leaves, Serve's proxy cancels its request in the replica: a /refine stream stops at its
next step. Locally `make up` runs it, on 127.0.0.1 only.
"""

import importlib.util
import os
from pathlib import Path

import ray
from ray import serve

# fastapi_onnx/app.py, beside this folder (in the repository, and in the image).
SERVICE = Path(__file__).resolve().parent.parent / "fastapi_onnx" / "app.py"


def keep_replica_grpc_on_loopback() -> None:
    """Ray Serve 2.60 starts a gRPC server in every replica (for calls between deployments) on every
    interface ([::]:0), with no setting to change it. Where the lab must stay on 127.0.0.1
    (SERVELAB_LOOPBACK_ONLY=1, set by the local stack), bind it there instead."""
    from ray.serve._private import replica

    bind = replica.add_port_to_grpc_server
    replica.add_port_to_grpc_server = lambda server, address: bind(server, address.replace("[::]", "127.0.0.1"))


if os.environ.get("SERVELAB_LOOPBACK_ONLY") == "1":  # read in each process that imports this file: each replica
    keep_replica_grpc_on_loopback()


class SayWhere:
    """ASGI middleware: which Ray node and replica answered, on every response (X-Ray-Node,
    X-Serve-Replica): how a client sees its requests spread over replicas and machines."""

    def __init__(self, app, headers: list[tuple[bytes, bytes]]) -> None:
        self.app, self.headers = app, headers

    async def __call__(self, scope, receive, send) -> None:
        async def send_with_headers(message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *self.headers]}
            await send(message)

        await self.app(scope, receive, send_with_headers)


@serve.deployment  # its options (replicas, autoscaling, resources): serve_config.yaml's deployment Food11
@serve.ingress()
class Food11:
    def __serve_build_asgi_app__(self):
        """fastapi_onnx's app, imported here, in the replica, with the settings of the replica's environment."""
        spec = importlib.util.spec_from_file_location("fastapi_onnx_app", SERVICE)
        service = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(service)
        node, replica = ray.get_runtime_context().get_node_id(), serve.get_replica_context().replica_id.unique_id
        service.app.add_middleware(
            SayWhere, headers=[(b"x-ray-node", node.encode()), (b"x-serve-replica", replica.encode())]
        )
        return service.app


app = Food11.bind()
