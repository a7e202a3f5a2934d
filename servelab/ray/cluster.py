"""Ray Serve past one machine, shown on one: a two-node Ray cluster on 127.0.0.1.

    python -m servelab.ray.cluster --port 8510 [--requests 40]      (prints a JSON report)

Ray's own multi-node test utility (`ray.cluster_utils.Cluster`) starts a head node and a second
node, each a raylet with its own CPUs, as two machines would have. The app of ray_serve/ is
deployed with two replicas and at most one per node, so Serve must place one on each node, and
one request at a time per replica; then concurrent requests go through Serve's proxy (on the
head node), and each answer's X-Ray-Node header says which node served it. The report lists the
nodes, the replicas that answered, and the requests each node served. Everything stops before
the command returns.

It runs in a process of its own (the tests and notebook 9 start it as a subprocess): a process
that has joined a Ray cluster stays a Ray driver until it exits.
"""

from __future__ import annotations

import argparse
import base64
import collections
import concurrent.futures
import json
import logging
import os
import sys
import tempfile
from pathlib import Path

import requests

from servelab import paths
from servelab.ray import local as ray_local

log = logging.getLogger(__name__)


def _request(url: str, image_b64: str) -> tuple[int, str, str]:
    response = requests.post(f"{url}/predict", json={"image": image_b64}, timeout=120)
    return response.status_code, response.headers.get("x-ray-node", ""), response.headers.get("x-serve-replica", "")


def two_nodes(port: int, request_count: int, token_file: Path) -> dict:
    ray_local.new_token(token_file)
    os.environ.update(ray_local.ray_environment(token_file))
    sys.path.insert(0, str(paths.RAY_SERVE_DIR))
    import ray
    from ray import serve
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    try:
        cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, configure_logging=False, log_to_driver=False)
        serve.start(http_options={"host": "127.0.0.1", "port": port}, proxy_location="HeadOnly")
        import app  # ray_serve/app.py

        # One request at a time per replica: Serve's proxy prefers the replica on its own node
        # while that one has room, so with a higher target the head's replica would take them all.
        one_per_node = app.Food11.options(
            num_replicas=2,
            max_replicas_per_node=1,
            max_ongoing_requests=1,
            ray_actor_options={
                "num_cpus": 1,
                # The model file of the artifacts folder: in the Compose project's Jupyter container,
                # the one built in the lab's PyTorch image (the clone has none there).
                "runtime_env": {
                    "env_vars": {
                        "PREDICT_CONCURRENCY": "1",
                        "INFERENCE_THREADS": "1",
                        "FOOD11_MODEL_PATH": str(paths.ARTIFACTS_DIR / "food11.onnx"),
                    }
                },
            },
        )
        serve.run(one_per_node.bind(), name="food11", route_prefix="/")
        image = base64.b64encode(paths.SAMPLE_IMAGE.read_bytes()).decode()
        url = f"http://127.0.0.1:{port}"
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(lambda _: _request(url, image), range(request_count)))
        nodes = [node["NodeID"] for node in ray.nodes() if node["Alive"]]
        return {
            "nodes": nodes,
            "node_addresses": sorted({node["NodeManagerAddress"] for node in ray.nodes() if node["Alive"]}),
            "statuses": dict(collections.Counter(status for status, _, _ in answers)),
            "requests_by_node": dict(collections.Counter(node for _, node, _ in answers)),
            "replicas_by_node": {
                node: sorted({replica for _, served_by, replica in answers if served_by == node})
                for node in {node for _, node, _ in answers}
            },
        }
    finally:
        if ray.is_initialized():
            ray_local.stop_serve_and_ray()
        cluster.shutdown()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True, help="Serve's HTTP proxy, on 127.0.0.1")
    parser.add_argument("--requests", type=int, default=40)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    with tempfile.TemporaryDirectory() as scratch:
        print(json.dumps(two_nodes(args.port, args.requests, Path(scratch) / "auth_token")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
