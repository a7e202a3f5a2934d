"""The instructor's check before class (scripts/check_class.py, `make check-class`), run as the
instructor runs it, against a package index and a container registry started here: a folder in
PEP 503's "simple" layout served by http.server, and a registry that answers the v2 API's manifest
requests only with the token its own token service hands out, as Docker Hub, nvcr.io and quay.io do.
No network: the real sources are pointed at these. The Dockerfiles and the lock read are the
repository's own."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from http.server import BaseHTTPRequestHandler, SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from servelab import paths
from tests.helpers import closed_port, file_module

check_class = file_module(paths.REPO_ROOT / "scripts" / "check_class.py")
PINS = check_class.lock_pins()
# The bases the Dockerfiles name, as their registries would be asked for them.
BASES = {image: check_class.ImageRef.parse(image) for image in check_class.base_images()}


@contextmanager
def serving(handler) -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def simple_index(root: Path, files: dict[str, list[str]]) -> Path:
    """A PEP 503 index under root/simple: a page per project linking its files, `+` quoted as PyTorch's does."""
    for project, names in files.items():
        page = root / "simple" / project / "index.html"
        page.parent.mkdir(parents=True, exist_ok=True)
        links = "".join(f'<a href="/whl/{urllib.parse.quote(name)}#sha256=00">{name}</a><br/>\n' for name in names)
        page.write_text(f"<!DOCTYPE html><html><body>\n{links}</body></html>\n")
    return root


def wheel(project: str, version: str, python: str) -> str:
    return f"{project}-{version}+cu126-cp{python}-cp{python}-manylinux_2_28_x86_64.whl"


def every_pin(*pythons: str) -> dict[str, list[str]]:
    return {project: [wheel(project, version, python) for python in pythons] for project, version in PINS.items()}


class Registry(BaseHTTPRequestHandler):
    """The v2 API's manifest HEAD, behind an anonymous bearer token, for the (repository, tag) in `known`."""

    known: set[tuple[str, str]] = set()
    seen: list[str] = []

    def do_GET(self) -> None:  # the token service
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
        self.seen.append(f"token {query['service'][0]} {query['scope'][0]}")
        body = json.dumps({"token": f"token-for-{query['scope'][0]}"}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_HEAD(self) -> None:
        repository, _, tag = self.path.removeprefix("/v2/").partition("/manifests/")
        scope = f"repository:{repository}:pull"
        if self.headers.get("Authorization") != f"Bearer token-for-{scope}":
            self.seen.append(f"401 {repository}")
            realm = f"http://127.0.0.1:{self.server.server_address[1]}/token"
            self.send_response(401)
            self.send_header("WWW-Authenticate", f'Bearer realm="{realm}",service="registry.test",scope="{scope}"')
        else:
            self.seen.append(f"manifest {repository}:{tag} {self.headers['Accept'].split(',')[0]}")
            self.send_response(200 if (repository, tag) in self.known else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


def run_check(index_url: str, registry_url: str) -> subprocess.CompletedProcess:
    hosts = {ref.registry for ref in BASES.values()}
    command = [sys.executable, "scripts/check_class.py", "--index-url", index_url, "--timeout", "10"]
    command += [arg for host in sorted(hosts) for arg in ("--registry", f"{host}={registry_url}")]
    return subprocess.run(command, cwd=paths.REPO_ROOT, capture_output=True, text=True, timeout=120)


@pytest.fixture
def registry():
    Registry.known, Registry.seen = {(ref.repository, ref.tag) for ref in BASES.values()}, []
    with serving(Registry) as url:
        yield url


def test_the_bases_and_the_pythons_are_read_from_the_dockerfiles():
    assert set(BASES) == {"python:3.11-slim-bookworm", "nvcr.io/nvidia/tritonserver:24.10-py3"}
    assert BASES["python:3.11-slim-bookworm"] == check_class.ImageRef(
        "docker.io", "library/python", "3.11-slim-bookworm"
    )
    assert check_class.ImageRef.parse("quay.io/jupyter/base-notebook:2024-10-07").registry == "quay.io"
    assert check_class.ImageRef.parse("localhost:5000/lab/triton:1") == check_class.ImageRef(
        "localhost:5000", "lab/triton", "1"
    )
    images = {image.dockerfile: (image.python, image.index_url) for image in check_class.torch_images()}
    cu126 = "https://download.pytorch.org/whl/cu126"
    assert images == {"docker/Dockerfile.torch": ("3.11", cu126), "docker/Dockerfile.triton": ("3.10", cu126)}


def test_everything_there_passes_after_each_registry_s_token_dance(tmp_path, registry):
    index = simple_index(tmp_path, every_pin("311", "310"))
    with serving(partial(SimpleHTTPRequestHandler, directory=str(index))) as url:
        done = run_check(f"{url}/simple", registry)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("\n  ok       ") == 2 * len(PINS) + len(BASES)
    assert f"  ok       torch {PINS['torch']} for Python 3.10 (docker/Dockerfile.triton, " in done.stdout
    assert f": {wheel('torch', PINS['torch'], '310')}" in done.stdout
    assert "Everything the build fetches is there." in done.stdout
    for ref in BASES.values():  # refused, a token asked for, then the manifest with it
        asked = [line for line in Registry.seen if ref.repository in line]
        assert asked[:2] == [f"401 {ref.repository}", f"token registry.test repository:{ref.repository}:pull"]
        assert asked[2].startswith(f"manifest {ref.repository}:{ref.tag} application/vnd.oci.image.index.v1+json")


def test_a_pin_without_a_wheel_for_triton_s_python_says_what_is_missing_and_what_to_change(tmp_path, registry):
    files = every_pin("311", "310")
    files["torch"] = [
        wheel("torch", PINS["torch"], "311"),
        wheel("torch", "2.13.1", "310"),
        wheel("torch", "2.9.0", "310"),
        wheel("torch", "2.99.0.dev20261201", "310"),  # a nightly is never what to pin
        f"torch-{PINS['torch']}+cu126-cp310-cp310-win_amd64.whl",  # not for the node
    ]
    index = simple_index(tmp_path, files)
    with serving(partial(SimpleHTTPRequestHandler, directory=str(index))) as url:
        done = run_check(f"{url}/simple", registry)
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"  MISSING  torch {PINS['torch']} for Python 3.10 (docker/Dockerfile.triton, " in done.stdout
    assert "no Linux x86_64 wheel; its newest for cp310 is 2.13.1+cu126" in done.stdout
    assert f"  ok       torch {PINS['torch']} for Python 3.11 (docker/Dockerfile.torch, " in done.stdout
    change = done.stdout.split("What to change:\n", 1)[1]
    assert f"torch=={PINS['torch']} (requirements.lock) has no wheel for Python 3.10 on {url}/simple" in change
    assert "docker/Dockerfile.triton installs from: pin torch to a release that has one (2.13.1)" in change
    assert "torchvision" not in change


def test_a_base_tag_its_registry_lacks_names_the_dockerfiles_to_change(tmp_path, registry):
    Registry.known = {(ref.repository, ref.tag) for image, ref in BASES.items() if image.startswith("python:")}
    index = simple_index(tmp_path, every_pin("311", "310"))
    with serving(partial(SimpleHTTPRequestHandler, directory=str(index))) as url:
        done = run_check(f"{url}/simple", registry)
    assert done.returncode == 1
    assert (
        "  MISSING  nvcr.io/nvidia/tritonserver:24.10-py3 (nvcr.io; docker/Dockerfile.triton): its registry"
        in done.stdout
    )
    assert "  ok       python:3.11-slim-bookworm (Docker Hub; docker/Dockerfile.torch, " in done.stdout
    assert (
        "nvcr.io/nvidia/tritonserver:24.10-py3 does not resolve: change the FROM of docker/Dockerfile.triton"
        in done.stdout
    )


def test_sources_it_cannot_reach_are_said_and_nothing_is_judged_there():
    port = closed_port()
    done = run_check(f"http://127.0.0.1:{port}/simple", f"http://127.0.0.1:{port}")
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr == ""  # said, not a traceback
    assert done.stdout.count("  UNREACHABLE ") == 2 * len(PINS) + len(BASES)
    assert "MISSING" not in done.stdout and "What to change" not in done.stdout
    assert f"Not judged, because this machine cannot reach them:\n  - cannot reach 127.0.0.1:{port}: " in done.stdout
