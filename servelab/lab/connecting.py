"""Where a notebook's Lab finds the lab's services (servelab.lab.facade.Lab.connect), as the Lab's
arguments: their addresses, the model repository Triton loads and what its server has, the stacks
the notebook started, and where the restarts of the services it uses are recorded.
"""

from __future__ import annotations

import atexit
import os
import shutil
from pathlib import Path
from typing import Any

from servelab import node_build, paths, service_exits
from servelab.lab.run_keeper import wait_until_answering
from servelab.lab.triton_side import NOTEBOOK_STACK_DIR
from servelab.profiles import Profile
from servelab.service.hardware import Hardware
from servelab.settings import settings
from servelab.stack.catalogue import fastapi_service, image_host_service, triton_service
from servelab.stack.supervision import LocalStack, Ports, ServiceSpec, answers, start_on_free_ports
from servelab.triton.server import LOCAL_TRITON


def compose(chosen: Profile, notebook: str, triton: bool) -> dict[str, Any]:
    """The Compose project's services, at the addresses compose.yaml gives the Jupyter container, once
    each answers (Triton only where `triton`: on the node its image may still be building, whose
    progress servelab.node_build shows); Triton's repository and hardware are in the shared volume."""
    given = settings()
    shared = given.triton_shared_dir
    fastapi_urls = {"pt": given.compose("fastapi_pt_url"), "onnx": given.compose("fastapi_onnx_url")}
    image_host_url = given.compose("image_host_url")
    triton_http = given.compose("triton_http") if triton else None
    if triton_http:
        ready = f"http://{triton_http}/v2/health/ready"
        node_build.wait_for_service("triton", lambda: answers(ready), paths.REPO_ROOT)
    wait_until_answering(health_urls(fastapi_urls, image_host_url, triton_http))
    return dict(
        services="compose",
        profile=chosen,
        fastapi_urls=fastapi_urls,
        triton_http=triton_http,
        triton_grpc=given.compose("triton_grpc") if triton else None,
        repository=shared / "models" if triton else None,
        image_host_url=image_host_url,
        triton_metrics_url=given.compose("triton_metrics_url") if triton else None,
        triton_server=Hardware.read(shared / "hardware.json") if triton else LOCAL_TRITON,
        notebook=notebook,
        # Triton's restarts, which a notebook without Triton neither waits for nor marks its runs with.
        shared_exits_file=shared / service_exits.EVENTS_FILE if triton else None,
    )


def local(chosen: Profile, notebook: str, triton: bool) -> dict[str, Any]:
    """The services of `make up` where they run (or the test suite's), else a stack of this notebook's
    own on free ports (Triton only where `triton`), stopped when its kernel exits."""
    default = Ports.configured()
    running = answers(f"http://127.0.0.1:{default.fastapi_pt}/health")
    running = running and answers(f"http://127.0.0.1:{default.image_host}/health")
    shared_exits = None
    repository: Path | None
    if running and answers(f"http://127.0.0.1:{default.triton_http}/v2/health/ready"):
        # `make up`'s stack (or the test suite's, moved by SERVELAB_PORT_* and SERVELAB_STACK_DIR).
        ports, repository, stacks = default, paths.TRITON_DIR / "models", []
        shared_exits = paths.LOG_DIR / service_exits.EVENTS_FILE
        print("Using the lab already running on this machine (`make up`).")
    else:
        work = NOTEBOOK_STACK_DIR / str(os.getpid())

        def services(ports: Ports) -> list[ServiceSpec]:
            return [
                image_host_service(ports.image_host),
                fastapi_service("pt", ports.fastapi_pt, image_host_port=ports.image_host),
                fastapi_service("onnx", ports.fastapi_onnx, image_host_port=ports.image_host),
                *([triton_service(ports.triton, work_dir=work / "triton")] if triton else []),
            ]

        names = "image_host, fastapi_pt, fastapi_onnx" + (", triton" if triton else "")
        print(f"Starting the local serving stack for this notebook ({names})...")
        stack, ports = start_on_free_ports(services, work / "logs")
        atexit.register(_stop_and_clean, stack, work)
        repository, stacks = (work / "triton" / "models" if triton else None), [stack]
    with_triton = triton or not stacks
    return dict(
        services="local",
        profile=chosen,
        fastapi_urls={
            "pt": f"http://127.0.0.1:{ports.fastapi_pt}",
            "onnx": f"http://127.0.0.1:{ports.fastapi_onnx}",
        },
        triton_http=f"127.0.0.1:{ports.triton_http}" if with_triton else None,
        triton_grpc=f"127.0.0.1:{ports.triton_grpc}" if with_triton else None,
        repository=repository,
        image_host_url=f"http://127.0.0.1:{ports.image_host}",
        triton_metrics_url=f"http://127.0.0.1:{ports.triton_metrics}/metrics" if with_triton else None,
        notebook=notebook,
        stacks=stacks,
        shared_exits_file=shared_exits,
    )


def health_urls(fastapi_urls: dict[str, str], image_host_url: str | None, triton_http: str | None) -> dict[str, str]:
    """Each service's health URL, by the name its exits are recorded under."""
    urls = {f"fastapi_{flavor}": f"{url}/health" for flavor, url in fastapi_urls.items()}
    if image_host_url:
        urls["image_host"] = f"{image_host_url}/health"
    if triton_http:
        urls["triton"] = f"http://{triton_http}/v2/health/ready"
    return urls


def _stop_and_clean(stack: LocalStack, work: Path) -> None:
    stack.stop()
    shutil.rmtree(work, ignore_errors=True)
