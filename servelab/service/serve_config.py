"""A Ray Serve config for the hardware its replicas get.

ray_serve/serve_config.yaml is written for the GPU node: one GPU per replica, two replicas at most
(the node has two GPUs). Where Ray has no GPU (the Compose project's CPU variant, the local stack),
a replica reserves a share of the cores instead, the cores divided by the most replicas the
deployment may run, so that they all fit; and, unless the config sets INFERENCE_THREADS, a
replica's inferences get as many threads as it reserved cores. Where it has fewer GPUs than the
replicas would reserve (a one-GPU machine), each replica reserves a share of the GPUs, so that they
all fit there too. Otherwise the config is served as written.

The ray_serve container's start (ray_serve/start.sh) runs

    python -m servelab.service.serve_config serve_config.yaml SERVED.yaml --hardware HARDWARE.json

which writes the config to deploy and the container's hardware (servelab.service.hardware), where
the notebooks read it to adapt their own edits the same way.
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path
from typing import Any

import yaml

from servelab.service.hardware import Hardware


def most_replicas(deployment: dict[str, Any]) -> int:
    """The most replicas a deployment may run: autoscaling's maximum, or its fixed number."""
    autoscaling = deployment.get("autoscaling_config") or {}
    return int(autoscaling.get("max_replicas") or deployment.get("num_replicas", 1))


def for_hardware(config: dict[str, Any], hardware: Hardware) -> dict[str, Any]:
    """`config` as Serve runs it on `hardware`: its replicas' GPUs where it has them all, a share of
    the GPUs where it has fewer, CPU shares where it has none."""
    fits = all(
        float(deployment.get("ray_actor_options", {}).get("num_gpus") or 0) * most_replicas(deployment) <= hardware.gpus
        for application in config["applications"]
        for deployment in application.get("deployments", [])
    )
    if hardware.gpus and fits:
        return config
    adapted = copy.deepcopy(config)
    for application in adapted["applications"]:
        for deployment in application.get("deployments", []):
            actor = deployment.setdefault("ray_actor_options", {})
            replicas = most_replicas(deployment)
            if actor.get("num_gpus") and hardware.gpus:
                actor["num_gpus"] = min(float(actor["num_gpus"]), round(hardware.gpus / replicas, 3))
                continue
            if actor.get("num_gpus"):
                del actor["num_gpus"]
                actor.setdefault("num_cpus", round(hardware.cores / replicas, 3))
            # Threads are a resource: a replica's inferences get the cores it reserved (at least one).
            env = actor.setdefault("runtime_env", {}).setdefault("env_vars", {})
            env.setdefault("INFERENCE_THREADS", str(max(1, int(actor.get("num_cpus") or 1))))
    return adapted


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m servelab.service.serve_config", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("config", type=Path, help="the Serve config as shipped")
    parser.add_argument("served", type=Path, help="where to write the config to deploy")
    parser.add_argument("--hardware", type=Path, required=True, help="where to write this container's hardware")
    args = parser.parse_args(argv)
    hardware = Hardware.here()
    hardware.write(args.hardware)
    served = for_hardware(yaml.safe_load(args.config.read_text()), hardware)
    args.served.write_text(yaml.safe_dump(served, sort_keys=False))
    print(f"Ray Serve on {hardware.describe()}: deploying {args.served}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
