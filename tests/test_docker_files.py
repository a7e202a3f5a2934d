"""Static checks of the Compose project (compose.yaml, the CPU variant, and docker/compose.gpu.yaml
over it) and of the Dockerfiles, read as text: what `docker compose build` and `up` would trip
over, checked where no Docker engine runs. `make test-docker` builds and runs the CPU variant for
real; the GPU variant, which needs an NVIDIA GPU, is checked here against the compose-spec schema
(and by `docker compose config` where Compose is installed, as both variants are).

The model files are built inside the lab's PyTorch image (docker/Dockerfile.torch), which the other
images name `servelab-torch`: no Dockerfile copies a model file of the clone's.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import jsonschema
import pytest
import tomllib
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from servelab import node_env
from servelab.settings import Settings
from tests.helpers import lock_pins

REPO_ROOT = Path(__file__).resolve().parent.parent
COMPOSE = REPO_ROOT / "compose.yaml"
# compose.yaml alone is the CPU variant; the GPU variant is this file over it.
GPU_OVERRIDE = REPO_ROOT / "docker" / "compose.gpu.yaml"
# The lab's images from a registry (SERVELAB_IMAGE_PREFIX), after either variant.
REGISTRY_OVERRIDE = REPO_ROOT / "docker" / "compose.registry.yaml"
# The compose-spec JSON schema, from the compose-spec repository (schema/compose-spec.json,
# Apache License 2.0), which Compose v2 validates every file against.
COMPOSE_SPEC_SCHEMA = REPO_ROOT / "tests" / "data" / "compose-spec.json"
# What each part of the lab installs (tests/test_dependencies.py checks the lock against it).
EXTRAS = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]

SERVICES = {"fastapi_pt", "fastapi_onnx", "triton", "ray_serve", "image_host", "gourmetgram", "jupyter"}
# Built, never run: the lab's PyTorch image, with the model files (docker/Dockerfile.torch).
TORCH_IMAGE = "torch"
TORCH_CONTEXT = "servelab-torch"
GPU_SERVICES = {"fastapi_pt", "fastapi_onnx", "triton", "ray_serve", "jupyter"}
# The GPUs each service reserves on the two-GPU node: "all", or the ids of its own.
GPUS = {"fastapi_pt": ["0"], "fastapi_onnx": ["1"], "triton": "all", "ray_serve": "all", "jupyter": "all"}
# Every image with CUDA libraries, and the Dockerfile that installs them: each pins cuDNN and checks
# every CUDA library against the P100.
GPU_LIBRARY_IMAGES = {"torch", "fastapi_onnx", "ray_serve", "triton", "jupyter"}
# The host ports, as `make up` numbers them (servelab.stack.supervision.Ports), each movable with SERVELAB_PORT_<NAME>.
PUBLISHED = {
    "fastapi_pt": {"FASTAPI_PT": (8100, 8000)},
    "fastapi_onnx": {"FASTAPI_ONNX": (8101, 8000)},
    "triton": {"TRITON_HTTP": (8200, 8000), "TRITON_GRPC": (8201, 8001), "TRITON_METRICS": (8202, 8002)},
    "ray_serve": {"RAY_SERVE": (8500, 8000)},
    "image_host": {"IMAGE_HOST": (8400, 8000)},
    "gourmetgram": {"GOURMETGRAM": (8300, 5000)},
    "jupyter": {"JUPYTER": (8888, 8888)},
}
MODEL_FILES_IN_THE_TORCH_IMAGE = "/opt/servelab/models"
# Debian 12 (bookworm), pinned: the plain tag moved to Debian 13 in August 2025 (docker/Dockerfile.torch).
PYTHON_BASE_IMAGE = "python:3.11-slim-bookworm"
# 24.10: the last release whose onnxruntime backend has sm_60 code (docker/Dockerfile.triton says why).
TRITON_BASE_IMAGE = "nvcr.io/nvidia/tritonserver:24.10-py3"
# What the Triton image's first guard scans: the backends the lab loads, and the server's libraries.
TRITON_TREE = ["/opt/tritonserver/backends/python", "/opt/tritonserver/backends/onnxruntime", "/opt/tritonserver/lib"]


# ---- reading the files ------------------------------------------------------------------------


class _ComposeLoader(yaml.SafeLoader):
    """YAML as Compose reads it: `!reset` drops what the files before it set (docker/compose.registry.yaml)."""


RESET = object()
_ComposeLoader.add_constructor("!reset", lambda loader, node: RESET)

_VAR_RE = re.compile(r"\$\$|\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}")


class MissingVariable(ValueError):
    """A ${VAR:?message} whose variable is unset: Compose stops with the message."""


def interpolate(text: str, env: dict[str, str]) -> str:
    """Compose's interpolation of the forms the project uses: ${VAR}, ${VAR:-default}, ${VAR-default},
    ${VAR:?message}."""

    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        value, op, default = env.get(match.group("name")), match.group("op"), match.group("arg") or ""
        if op == ":?":
            if not value:
                raise MissingVariable(f"{match.group('name')}: {default}")
            return value
        if op == ":-":
            return value or default
        if op == "-":
            return default if value is None else value
        return value or ""

    return _VAR_RE.sub(replace, text)


def load(path: Path, env: dict[str, str] | None = None) -> dict:
    return yaml.load(interpolate(path.read_text(), env or {}), Loader=_ComposeLoader)


def merge(base, override):
    """Compose's merge of an override file: mappings merged key by key, `!reset` removes."""
    if isinstance(base, dict) and isinstance(override, dict):
        merged = dict(base)
        for key, value in override.items():
            if value is RESET:
                merged.pop(key, None)
            else:
                merged[key] = merge(base.get(key), value)
        return merged
    return override


def variant(cpu: bool, env: dict[str, str] | None = None) -> dict:
    project = load(COMPOSE, env)
    return project if cpu else merge(project, load(GPU_OVERRIDE, env))


def dockerfile_instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, with comments dropped and continuation lines joined."""
    instructions, pending = [], ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        keyword, _, args = (pending + line).partition(" ")
        instructions.append((keyword.upper(), args.strip()))
        pending = ""
    assert not pending, f"{path}: the last instruction ends with a line continuation"
    return instructions


def dockerfiles() -> dict[str, Path]:
    return {
        name: REPO_ROOT / service["build"]["dockerfile"] for name, service in variant(cpu=False)["services"].items()
    }


def copy_sources(args: str) -> list[str]:
    parts = json.loads(args) if args.startswith("[") else [p for p in shlex.split(args) if not p.startswith("--")]
    return parts[:-1]


def published(service: dict) -> list[tuple[str, str, str]]:
    """(host address, host port, container port) of each short-syntax port mapping."""
    return [tuple(str(mapping).split(":")) for mapping in service.get("ports", [])]


# ---- the project ------------------------------------------------------------------------------


@pytest.mark.parametrize("cpu", [False, True], ids=["gpu", "cpu"])
def test_each_variant_is_valid_under_the_compose_spec_schema(cpu):
    schema = json.loads(COMPOSE_SPEC_SCHEMA.read_text())
    jsonschema.Draft7Validator(schema).validate(variant(cpu))
    with pytest.raises(jsonschema.ValidationError, match="imagee"):  # the schema does refuse a misspelt key
        jsonschema.Draft7Validator(schema).validate({"services": {"x": {"imagee": "servelab"}}})


def compose_config(env_lines: list[str], tmp_path: Path) -> dict:
    """The project as Compose itself reads it in the clone (`docker compose config`, no -f), with a
    .env of `env_lines` in place of any the clone has."""
    version = subprocess.run(["docker", "compose", "version"], capture_output=True, text=True)
    if version.returncode != 0:
        pytest.skip("no Compose v2 plugin here: `make test-docker` installs it (scripts/docker_engine.sh)")
    dotenv = tmp_path / "env"
    dotenv.write_text("".join(line + "\n" for line in env_lines))
    env = {key: value for key, value in os.environ.items() if not key.startswith(("COMPOSE_", "SERVELAB_"))}
    command = ["docker", "compose", "--env-file", str(dotenv), "config", "--format", "json"]
    done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.skipif(shutil.which("docker") is None, reason="no docker CLI here: `make test-docker` installs Compose")
def test_plain_docker_compose_with_no_env_file_is_the_cpu_variant_and_the_node_s_one_line_the_gpu_one(tmp_path):
    cpu = compose_config([], tmp_path)["services"]
    gpu = compose_config(node_env.env_file("").splitlines(), tmp_path)["services"]
    for name in ("fastapi_pt", "fastapi_onnx", "ray_serve"):
        assert cpu[name]["environment"]["INFERENCE_DEVICE"] == "cpu" and "deploy" not in cpu[name], name
        assert gpu[name]["environment"]["INFERENCE_DEVICE"] == "cuda", name
    for name in GPU_SERVICES:
        assert gpu[name]["deploy"]["resources"]["reservations"]["devices"][0]["driver"] == "nvidia", name
    assert cpu["torch"]["build"]["args"]["CUDA_ARCH"] == "" and gpu["torch"]["build"]["args"]["CUDA_ARCH"] == "6.0"
    assert cpu["jupyter"]["build"]["args"]["ONNXRUNTIME"] == "onnxruntime"
    assert gpu["jupyter"]["build"]["args"]["ONNXRUNTIME"].startswith("onnxruntime-gpu[cuda,cudnn]")
    assert set(cpu["triton"]["ulimits"]) == {"stack"} and gpu["triton"]["ulimits"]["memlock"] == -1
    # What the files of each variant give Compose, as this module reads them (the other tests' reading).
    for services, cpu_variant in ((cpu, True), (gpu, False)):
        read = variant(cpu_variant)["services"]
        for name in SERVICES:
            assert services[name]["build"].get("args", {}) == read[name]["build"].get("args", {}), name
            assert ("deploy" in services[name]) == ("deploy" in read[name]), name


@pytest.mark.skipif(shutil.which("docker") is None, reason="no docker CLI here: `make test-docker` installs Compose")
def test_compose_itself_accepts_the_registry_s_images_over_the_gpu_variant(tmp_path):
    prefix = "registry.example.org/course/servelab-"
    services = compose_config(node_env.env_file("original", prefix).splitlines(), tmp_path)["services"]
    assert services["fastapi_pt"]["image"] == prefix + "fastapi_pt" and "build" not in services["fastapi_pt"]
    assert services["fastapi_pt"]["environment"]["INFERENCE_DEVICE"] == "cuda"


def test_the_cpu_and_gpu_files_need_no_compose_newer_than_the_docs_say():
    """`!reset` came in Compose 2.24.0 and `!override` in 2.24.4: the two files a student or the node
    runs merge with the plain rules, and need Compose 2.22 (service: build contexts), as the docs say
    and scripts/docker_engine.sh checks; only the registry's file, an instructor's, resets."""

    def tags(path: Path) -> set[str]:
        return set(re.findall(r"!(reset|override)\b", re.sub(r"#.*", "", path.read_text())))

    assert tags(COMPOSE) == tags(GPU_OVERRIDE) == set() and tags(REGISTRY_OVERRIDE) == {"reset"}
    engine = (REPO_ROOT / "scripts" / "docker_engine.sh").read_text()
    assert "MIN_COMPOSE=2.22.0" in engine
    assert "Compose 2.22 or later" in COMPOSE.read_text()
    docs = (REPO_ROOT / "docs" / "docker.md").read_text()
    assert "Compose 2.22" in docs and "2.24" in docs


@pytest.mark.parametrize(
    ("installed", "enough"),
    [
        ("2.40.3", True),
        ("v2.22.0", True),
        ("2.22.0-desktop.1", True),
        ("2.21.0", False),
        ("2.3.3", False),
        ("1.29.2", False),
    ],
)
def test_the_engine_script_tells_a_compose_too_old_from_one_new_enough(installed, enough):
    engine = (REPO_ROOT / "scripts" / "docker_engine.sh").read_text()
    function = re.search(r"^at_least\(\) \{\n.*?^\}\n", engine, re.M | re.S).group(0)
    done = subprocess.run(["bash", "-c", f'{function}at_least "$1" 2.22.0', "-", installed], capture_output=True)
    assert (done.returncode == 0) == enough


@pytest.mark.parametrize("cpu", [False, True], ids=["gpu", "cpu"])
def test_with_an_image_prefix_every_service_is_pulled_from_the_registry_and_nothing_is_built(cpu):
    # The live pull (a registry, `docker compose pull`) needs a Docker engine and images pushed to
    # it, which `make test` has neither of: what Compose would pull is read here instead.
    prefix = "registry.example.org:5000/course/servelab-"
    env = {"SERVELAB_IMAGE_PREFIX": prefix}
    project = merge(variant(cpu, env), load(REGISTRY_OVERRIDE, env))
    jsonschema.Draft7Validator(json.loads(COMPOSE_SPEC_SCHEMA.read_text())).validate(project)
    active = {name: service for name, service in project["services"].items() if not service.get("profiles")}
    assert set(active) == SERVICES, "the PyTorch image, never run, is not pulled"
    for name, service in project["services"].items():
        assert service["image"] == prefix + name and "build" not in service, name
    with pytest.raises(MissingVariable, match="SERVELAB_IMAGE_PREFIX: set SERVELAB_IMAGE_PREFIX to the registry"):
        load(REGISTRY_OVERRIDE, {})
    files = node_env.env_file("original", prefix)
    gpu, registry = (path.relative_to(REPO_ROOT) for path in (GPU_OVERRIDE, REGISTRY_OVERRIDE))
    assert f"COMPOSE_FILE=compose.yaml:{gpu}:{registry}" in files.splitlines()


def test_one_project_has_every_service_of_notebooks_3_to_10_with_no_fixed_container_name():
    project = variant(cpu=False)
    assert project["name"] == "servelab"
    assert set(project["services"]) == SERVICES | {TORCH_IMAGE}
    for name, service in project["services"].items():
        assert "container_name" not in service, f"{name}: a fixed name would clash with another project's"


@pytest.mark.parametrize("cpu", [False, True], ids=["gpu", "cpu"])
def test_every_port_is_published_on_loopback_at_the_local_stack_s_number_and_none_twice(cpu):
    services = variant(cpu)["services"]
    assert "ports" not in services[TORCH_IMAGE]
    for name, expected in PUBLISHED.items():
        found = published(services[name])
        assert found == [("127.0.0.1", str(host), str(inside)) for host, inside in expected.values()], name
    hosts = Counter(host for service in services.values() for _, host, _ in published(service))
    assert max(hosts.values()) == 1, hosts
    moved = variant(cpu, {"SERVELAB_PORT_JUPYTER": "9999"})["services"]["jupyter"]
    assert published(moved) == [("127.0.0.1", "9999", "8888")]


def test_the_gpu_variant_gives_each_service_its_gpus_and_the_cpu_variant_none():
    gpu, cpu = variant(cpu=False)["services"], variant(cpu=True)["services"]
    for name, gpus in GPUS.items():
        (device,) = gpu[name]["deploy"]["resources"]["reservations"]["devices"]
        assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"], name
        assert (device.get("count") if gpus == "all" else device.get("device_ids")) == gpus, name
        assert not ("count" in device and "device_ids" in device), f"{name}: Compose takes one of them"
    assert set(GPUS) == GPU_SERVICES
    assert not any("deploy" in service for name, service in cpu.items() if name != TORCH_IMAGE)
    assert gpu["triton"]["ulimits"] == {"stack": 67108864, "memlock": -1}
    assert cpu["triton"]["ulimits"] == {"stack": 67108864}


@pytest.mark.parametrize("cpu", [False, True], ids=["gpu", "cpu"])
def test_the_torch_image_is_built_first_never_run_and_named_by_every_image_that_uses_it(cpu):
    services = variant(cpu)["services"]
    assert services[TORCH_IMAGE]["deploy"] == {"replicas": 0}
    assert services[TORCH_IMAGE]["build"]["dockerfile"] == "docker/Dockerfile.torch"
    for name, service in services.items():
        instructions = dockerfile_instructions(REPO_ROOT / service["build"]["dockerfile"])
        named = any(args.split()[0] == TORCH_CONTEXT or f"--from={TORCH_CONTEXT}" in args for _, args in instructions)
        contexts = service["build"].get("additional_contexts", {})
        assert (contexts == {TORCH_CONTEXT: f"service:{TORCH_IMAGE}"}) == named, f"{name}: {contexts}"
    users = {name for name, service in services.items() if service["build"].get("additional_contexts")}
    assert users == {"fastapi_pt", "fastapi_onnx", "triton", "ray_serve", "jupyter"}
    for name in ("fastapi_pt", "jupyter"):  # PyTorch installed once, for both
        assert dockerfile_instructions(dockerfiles()[name])[0] == ("FROM", TORCH_CONTEXT), name


def test_the_cpu_variant_installs_cpu_builds_and_asks_the_services_for_the_cpu():
    gpu, cpu = variant(cpu=False)["services"], variant(cpu=True)["services"]
    for name in ("torch", "triton"):
        assert cpu[name]["build"]["args"]["TORCH_INDEX_URL"].endswith("/whl/cpu")
    assert variant(True, {"TORCH_INDEX_URL": ""})["services"]["torch"]["build"]["args"]["TORCH_INDEX_URL"] == ""
    for name in ("fastapi_onnx", "ray_serve", "jupyter"):
        assert cpu[name]["build"]["args"]["ONNXRUNTIME"] == "onnxruntime"  # at the lock's version
    variant_args = {"TORCH_INDEX_URL", "ONNXRUNTIME", "CUDNN", "CUDA_ARCH"}
    for name in GPU_LIBRARY_IMAGES:
        defaults = dict(
            value.split("=", 1) for keyword, value in dockerfile_instructions(dockerfiles()[name]) if keyword == "ARG"
        )
        given = {key: value for key, value in gpu[name]["build"]["args"].items() if key in variant_args}
        assert given == {key: defaults[key].strip('"') for key in variant_args if key in defaults}, (
            f"{name}: the GPU variant builds with its Dockerfile's defaults"
        )
        assert cpu[name]["build"]["args"]["CUDNN"] == "" and cpu[name]["build"]["args"]["CUDA_ARCH"] == "", name
    for name in ("fastapi_pt", "fastapi_onnx", "ray_serve"):
        assert cpu[name]["environment"]["INFERENCE_DEVICE"] == "cpu"
        assert gpu[name]["environment"]["INFERENCE_DEVICE"] == "cuda"
        assert gpu[name]["environment"]["IMAGE_URL_ALLOWED_HOSTS"] == "image_host:8000"  # merged, not replaced
        instructions = dockerfile_instructions(dockerfiles()[name])
        assert ("ENV", "INFERENCE_DEVICE=cuda") in instructions, "the image's own default: the GPU node's"


def test_the_torch_image_builds_the_model_files_from_the_weights_the_project_s_environment_names():
    torch = variant(False, {"FOOD11_CHECKPOINT": "original"})["services"][TORCH_IMAGE]
    assert torch["build"]["args"]["FOOD11_CHECKPOINT"] == "original"
    assert not variant(cpu=True)["services"][TORCH_IMAGE]["build"]["args"]["FOOD11_CHECKPOINT"]
    instructions = dockerfile_instructions(REPO_ROOT / "docker" / "Dockerfile.torch")
    args = {value.split("=")[0] for keyword, value in instructions if keyword == "ARG"}
    assert {"FOOD11_CHECKPOINT", "FOOD11_CHECKPOINT_SHA256", "FOOD11_CHECKPOINT_GIT_BLOB"} <= args
    runs = [value for keyword, value in instructions if keyword == "RUN"]
    assert any("python -m servelab.stack.artifacts --build-only" in run for run in runs)
    assert ("ENV", f"SERVELAB_ARTIFACTS_DIR={MODEL_FILES_IN_THE_TORCH_IMAGE}") in instructions


def test_every_image_is_built_from_the_repository_root_with_its_own_dockerfile():
    for name, service in variant(cpu=False)["services"].items():
        assert service["build"]["context"] == ".", f"{name}: every image installs servelab from the root"
        assert service["build"]["network"] == "host"
        assert (REPO_ROOT / service["build"]["dockerfile"]).is_file()
    ignored = (REPO_ROOT / ".dockerignore").read_text().splitlines()
    assert ignored[ignored.index("*")] == "*" and "!servelab/" in ignored  # an allow-list: never .venv or .lab


def test_the_jupyter_container_reaches_every_service_by_name_on_the_port_it_listens_on():
    services = variant(cpu=False)["services"]
    environment = services["jupyter"]["environment"]
    assert environment["LAB_SERVICES"] == "compose"
    assert set(environment) <= {field.metadata["variable"] for field in dataclasses.fields(Settings)}
    checked = 0
    for key, value in environment.items():
        match = re.fullmatch(r"(?:http://)?([a-z_]+):(\d+)(/.*)?", str(value))
        if match is None:
            continue
        host, port = match.group(1), match.group(2)
        assert host in services, f"{key}={value} names no service"
        listening = {inside for _, _, inside in published(services[host])}
        listening |= {"8265", "8080"} if host == "ray_serve" else set()  # Ray's dashboard and metrics, unpublished
        assert port in listening, f"{key}={value}"
        checked += 1
    assert checked >= 8
    assert services["gourmetgram"]["environment"]["FASTAPI_SERVER_URL"] == "http://fastapi_pt:8000"


def test_triton_and_jupyter_share_the_served_repository_and_ray_s_token_read_only():
    services = variant(cpu=False)["services"]
    triton, ray, jupyter = services["triton"], services["ray_serve"], services["jupyter"]
    assert "./models_staging:/models:ro" in triton["volumes"]
    shared = triton["environment"]["TRITON_SHARED_DIR"]
    assert f"triton:{shared}" in triton["volumes"] and f"triton:{shared}" in jupyter["volumes"]
    assert jupyter["environment"]["TRITON_SHARED_DIR"] == shared
    assert ray["environment"]["RAY_AUTH_MODE"] == "token"
    assert ray["environment"]["RAY_AUTH_TOKEN_PATH"].startswith(ray["environment"]["RAY_SHARED_DIR"] + "/")
    assert f"ray:{ray['environment']['RAY_SHARED_DIR']}" in ray["volumes"]
    assert f"ray:{jupyter['environment']['RAY_SHARED_DIR']}:ro" in jupyter["volumes"]
    assert ".:/home/jovyan/work" in jupyter["volumes"]
    for name, service in services.items():
        for volume in service.get("volumes", []):
            source = str(volume).split(":")[0]
            assert not source.startswith(("/", "~")), f"{name}: absolute host path {source}"
            if source.startswith("."):
                assert (REPO_ROOT / source).is_dir(), f"{name}: {source} is missing"


def test_every_service_has_a_health_check_and_restarts_unless_stopped():
    for name, service in variant(cpu=False)["services"].items():
        if name in ("jupyter", TORCH_IMAGE):
            continue
        assert service["restart"] == "unless-stopped", name
        assert "start_period" in service["healthcheck"], name
    assert "/v2/health/ready" in " ".join(variant(cpu=False)["services"]["triton"]["healthcheck"]["test"])
    assert int(str(variant(cpu=False)["services"]["triton"]["shm_size"]).rstrip("gb")) >= 1


# ---- the Dockerfiles --------------------------------------------------------------------------


@pytest.mark.parametrize("service", sorted(SERVICES | {TORCH_IMAGE}))
def test_copy_sources_are_in_the_repository_or_are_the_torch_image_s_model_files(service):
    dockerfile = dockerfiles()[service]
    for keyword, args in dockerfile_instructions(dockerfile):
        if keyword in ("COPY", "ADD"):
            stage = re.search(r"--from=(\S+)", args)
            for source in copy_sources(args):
                if stage is not None:  # from a stage or the torch image: its model files, nothing else
                    assert stage.group(1) in (TORCH_CONTEXT, "models"), args
                    assert source.startswith((MODEL_FILES_IN_THE_TORCH_IMAGE, "/models")), args
                    continue
                assert not source.startswith(("/", "..")), f"{dockerfile}: COPY {source} leaves the root"
                assert (REPO_ROOT / source).exists(), f"{dockerfile}: COPY {source}: not in the repository"
                assert not source.endswith((".pth", ".onnx")), f"{dockerfile}: copies the clone's model file {source}"


@pytest.mark.parametrize("service", sorted(GPU_LIBRARY_IMAGES))
def test_each_gpu_image_pins_the_last_cudnn_with_pascal_code_and_checks_its_cuda_libraries(service):
    instructions = dockerfile_instructions(dockerfiles()[service])
    assert ("ARG", "CUDNN=nvidia-cudnn-cu12==9.10.2.21") in instructions
    assert ("ARG", "CUDA_ARCH=6.0") in instructions
    installs = [args for keyword, args in instructions if keyword == "RUN" and re.search(r"\bpip3? install\b", args)]
    assert any('${CUDNN:+"$CUDNN"}' in args for args in installs), "cuDNN's pin goes with the libraries"
    guards = [i for i, (keyword, args) in enumerate(instructions) if keyword == "RUN" and "cuda_arch.py" in args]
    if service == "triton":  # NVIDIA's libraries first, then what pip installed
        first, *guards = guards
        assert first < min(i for i, (keyword, _) in enumerate(instructions) if keyword == "RUN" and i != first)
        assert instructions[first][1].split('--arch "$CUDA_ARCH"')[1].split(";")[0].split() == TRITON_TREE
        assert ALLOW_LIST_READ in instructions[first][1], "every guard reads the one allow list"
    assert len(guards) == 1, "one check, after the CUDA libraries are installed"
    (guard,) = guards
    guard_args = instructions[guard][1]
    assert '--arch "$CUDA_ARCH"' in guard_args and 'if [ -n "$CUDA_ARCH" ]' in guard_args  # the CPU variant: no GPU
    assert ALLOW_LIST_READ in guard_args and "--allow " not in guard_args, "the one allow list, no allow of its own"
    cuda_installs = [i for i, (keyword, args) in enumerate(instructions) if keyword == "RUN" and "CUDNN" in args]
    assert max(cuda_installs) < guard


# Every guard: the build guard and the allow list bound from docker/, and the list read.
GUARD_MOUNTS = (
    "--mount=type=bind,source=docker/cuda_arch.py,target=/tmp/cuda_arch.py",
    "--mount=type=bind,source=docker/cuda_allow.txt,target=/tmp/cuda_allow.txt",
)
ALLOW_LIST_READ = "/tmp/cuda_arch.py --allow-file /tmp/cuda_allow.txt"


def test_every_guard_binds_the_guard_and_its_one_allow_list_and_each_allow_says_why():
    guards = [
        (name, args)
        for name, dockerfile in dockerfiles().items()
        for keyword, args in dockerfile_instructions(dockerfile)
        if keyword == "RUN" and "cuda_arch.py" in args
    ]
    assert {name for name, _ in guards} == GPU_LIBRARY_IMAGES
    for name, args in guards:
        assert args.split(" if ")[0].split() == list(GUARD_MOUNTS), name
    allows = [line.split(None, 1) for line in (REPO_ROOT / "docker" / "cuda_allow.txt").read_text().splitlines()]
    allows = [allow for allow in allows if allow and not allow[0].startswith("#")]
    assert {glob for glob, _ in allows} >= {"libcusparseLt.so*", "libcufftw.so*"}
    for glob, why in allows:
        assert len(why) > 40, f"docker/cuda_allow.txt: {glob} says why no lab model needs it"


@pytest.mark.parametrize("service", sorted(SERVICES | {TORCH_IMAGE}))
def test_no_dockerfile_guards_copies_and_every_pip_install_keeps_its_downloads_in_the_build_cache(service):
    dockerfile = dockerfiles()[service]
    text = dockerfile.read_text()
    assert "test -f" not in text and "make artifacts' in the repository root first" not in text
    assert ("ARG", "PIP_CACHE_DIR=/var/cache/pip") in dockerfile_instructions(dockerfile)
    for keyword, args in dockerfile_instructions(dockerfile):
        if keyword == "RUN" and re.search(r"\bpip3? install\b", args):
            assert args.startswith("--mount=type=cache,") and "target=/var/cache/pip" in args, args
            assert "--no-cache-dir" not in args


@pytest.mark.parametrize("service", ["fastapi_pt", "fastapi_onnx", "gourmetgram"])
def test_a_service_s_image_copies_its_app_with_the_model_module_beside_it_and_nothing_of_the_lab(service):
    instructions = dockerfile_instructions(dockerfiles()[service])
    copies = [args for keyword, args in instructions if keyword == "COPY" and "--from=" not in args]
    assert any(args.startswith("food11.py ") and args.endswith(" ./") for args in copies), copies
    assert not any("servelab" in args for args in copies)
    assert not any(keyword == "RUN" and "--no-deps" in args for keyword, args in instructions)


@pytest.mark.parametrize("service", ["ray_serve", "triton", "jupyter"])
def test_each_image_of_the_lab_s_tools_installs_its_package_from_the_repository_after_its_dependencies(service):
    instructions = dockerfile_instructions(dockerfiles()[service])
    copies = [
        i
        for i, (keyword, args) in enumerate(instructions)
        if keyword == "COPY" and "servelab" in args and "--from=" not in args
    ]
    installs = [i for i, (keyword, args) in enumerate(instructions) if keyword == "RUN" and "--no-deps" in args]
    dependencies = [i for i, (keyword, args) in enumerate(instructions) if keyword == "RUN" and "pip" in args]
    assert copies and installs and copies[-1] < installs[-1], "servelab is copied, then installed"
    assert dependencies[0] < copies[0], "the dependencies come first: a code change reinstalls none of them"
    copied = " ".join(instructions[i][1] for i in copies)
    assert "servelab/service" in copied or "servelab ./servelab" in copied or "servelab /src/servelab" in copied


def test_the_fastapi_and_ray_images_serve_the_gpu_builds_by_default():
    for service in ("torch", "triton"):
        instructions = dockerfile_instructions(dockerfiles()[service])
        assert ("ARG", "TORCH_INDEX_URL=https://download.pytorch.org/whl/cu126") in instructions
        # The lock's torch and torchvision (2.14, the last release with cu126 wheels), from that index.
        assert any(
            re.search(r'\$\{TORCH_INDEX_URL:\+--index-url "\$TORCH_INDEX_URL"\}\s+-r /tmp/torch\.txt', args)
            for _, args in instructions
        ), service
    assert re.search(r"^torch==2\.14\.\d+$", (REPO_ROOT / "requirements.lock").read_text(), re.M)
    for service in ("fastapi_onnx", "ray_serve", "jupyter"):
        instructions = dockerfile_instructions(dockerfiles()[service])
        assert ("ARG", 'ONNXRUNTIME="onnxruntime-gpu[cuda,cudnn]>=1.21,<1.26"') in instructions, service
    assert dockerfile_instructions(dockerfiles()["torch"])[0] == ("FROM", f"{PYTHON_BASE_IMAGE} AS torch")
    for service in ("fastapi_pt", "fastapi_onnx", "ray_serve"):
        instructions = dockerfile_instructions(dockerfiles()[service])
        assert instructions[0] in (("FROM", PYTHON_BASE_IMAGE), ("FROM", TORCH_CONTEXT))
        assert ("ENV", "INFERENCE_DEVICE=cuda") in instructions
        for keyword, args in instructions:
            assert "LD_LIBRARY_PATH" not in args and "site-packages" not in args, f"{service}: {keyword} {args}"


def test_the_triton_image_stages_the_repository_for_its_server_and_pins_the_release():
    instructions = dockerfile_instructions(dockerfiles()["triton"])
    assert [args for keyword, args in instructions if keyword == "FROM"] == [TRITON_BASE_IMAGE]
    assert json.loads(dict(instructions)["CMD"]) == ["python3", "-m", "servelab.triton.container"]
    assert ("COPY", "docker/triton_log_copy.sh /usr/local/bin/triton_log_copy.sh") in instructions
    runs = " ".join(args for keyword, args in instructions if keyword == "RUN")
    assert '"/src[triton]"' in runs  # its extra: the lab's one Triton client, numpy 1.x
    assert {"tritonclient[grpc]==2.51.0", "numpy<2"} <= set(EXTRAS["triton"])
    # The model files of the torch image, staged by the start (servelab.triton.container).
    assert ("ENV", f"SERVELAB_ARTIFACTS_DIR={MODEL_FILES_IN_THE_TORCH_IMAGE}") in instructions
    # The whole package, not servelab/service alone, for the start; the model module the models import.
    assert ("COPY", "servelab /src/servelab") in instructions and ("COPY", "food11.py /src/") in instructions


def test_the_jupyter_image_has_the_virtualenv_s_client_and_runs_as_the_clone_s_owner():
    instructions = dockerfile_instructions(dockerfiles()["jupyter"])
    assert instructions[0] == ("FROM", TORCH_CONTEXT)
    runs = " ".join(args for keyword, args in instructions if keyword == "RUN")
    # The virtualenv's notebook tools (its `lab` extra has this one): Debian 12's glibc runs the
    # perf_analyzer of tritonclient 2.51; `make test-docker` runs the notebooks here with `pytest --nbmake`.
    assert '"/src[notebooks]"' in runs and "libb64-0d" in runs
    assert "servelab[notebooks,image-host,triton,model-files]" in EXTRAS["lab"]
    notebooks = set(EXTRAS["notebooks"])
    assert {
        "tritonclient[all]==2.51.0",
        "nbmake==1.5.5",
        "pytest>=8",
        "pytest-timeout>=2.3",
        "ipywidgets>=8",
    } <= notebooks
    assert "servelab[service,ray-serve,gourmetgram]" in notebooks and "ray[serve]==2.60.0" in EXTRAS["ray-serve"]
    assert "pip install --no-deps -e ." in runs  # servelab, editable where the clone is mounted
    assert "useradd --create-home --uid 1000 --gid 100" in runs  # the group Triton's staged configs share
    assert [args for keyword, args in instructions if keyword == "USER"] == ["jovyan"]
    assert json.loads(dict(instructions)["CMD"])[:2] == ["jupyter", "lab"]


def test_the_jupyter_container_gets_nvidia_smi_on_the_node_from_the_nvidia_toolkit():
    """Notebooks 6 and 7 run nvidia-smi beside a perf_analyzer run. The NVIDIA container toolkit mounts
    the driver's nvidia-smi (and NVML) into a container given GPUs where its driver capabilities
    include `utility`; unset, they are `utility,compute` (the toolkit's default). So the Jupyter
    container has every GPU, and nothing narrows those capabilities: not the GPU reservation (Docker
    would set NVIDIA_DRIVER_CAPABILITIES from any capability besides `gpu`), not its environment, not
    an ENV of its image or of the PyTorch image it is built on."""
    jupyter = variant(cpu=False)["services"]["jupyter"]
    (device,) = jupyter["deploy"]["resources"]["reservations"]["devices"]
    assert device == {"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}
    assert "NVIDIA_DRIVER_CAPABILITIES" not in jupyter["environment"]
    for image in ("jupyter", TORCH_IMAGE):
        environment = " ".join(
            args for keyword, args in dockerfile_instructions(dockerfiles()[image]) if keyword == "ENV"
        )
        assert "NVIDIA_DRIVER_CAPABILITIES" not in environment, image
    assert "nvidia-smi" in GPU_OVERRIDE.read_text()  # the file says why the notebooks can run it


def test_gourmetgram_s_image_runs_gunicorn_with_the_config_that_says_how_many_workers():
    instructions = dockerfile_instructions(dockerfiles()["gourmetgram"])
    assert json.loads(dict(instructions)["CMD"]) == ["gunicorn", "--config", "gunicorn.conf.py", "app:app"]
    assert ("COPY", "gourmetgram/ .") in instructions  # the config lands beside app.py, in the WORKDIR
    config = (REPO_ROOT / "gourmetgram" / "gunicorn.conf.py").read_text()
    assert len(re.findall(r"^workers = \d+$", config, re.M)) == 1, "the workers are said in one place"
    assert any(Requirement(text).name == "gunicorn" for text in EXTRAS["gourmetgram"])


def test_the_ray_image_deploys_the_serve_config_for_its_hardware():
    instructions = dockerfile_instructions(dockerfiles()["ray_serve"])
    assert json.loads(dict(instructions)["CMD"]) == ["sh", "start.sh"]
    start = (REPO_ROOT / "ray_serve" / "start.sh").read_text()
    assert subprocess.run(["sh", "-n", REPO_ROOT / "ray_serve" / "start.sh"]).returncode == 0
    assert "python -m servelab.service.serve_config serve_config.yaml" in start
    assert "--metrics-export-port 8080" in start and "serve deploy /tmp/serve_config.served.yaml" in start
    config = yaml.safe_load((REPO_ROOT / "ray_serve" / "serve_config.yaml").read_text())
    (deployment,) = config["applications"][0]["deployments"]
    assert deployment["ray_actor_options"]["num_gpus"] == 1  # a GPU per replica on the node


@pytest.mark.parametrize("log_file_set", [True, False])
def test_triton_start_script_copies_the_output_and_passes_it_on(tmp_path, log_file_set):
    log_file = tmp_path / "logs" / "triton.log"
    env = {**os.environ, "TRITON_LOG_FILE": str(log_file) if log_file_set else ""}
    command = [
        str(REPO_ROOT / "docker" / "triton_log_copy.sh"),
        "sh",
        "-c",
        "echo to stdout; echo to stderr >&2; exit 3",
    ]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 3  # the server's exit status is the container's
    seen = done.stdout + done.stderr
    assert "to stdout" in seen and "to stderr" in seen  # `docker compose logs` still shows everything
    if log_file_set:
        assert log_file.read_text().splitlines() == ["to stdout", "to stderr"]
    else:
        assert not log_file.exists()


def test_the_stand_ins_are_tagged_with_the_real_names_of_every_base_the_dockerfiles_name():
    bases = {
        args.split()[0]
        for path in dockerfiles().values()
        for keyword, args in dockerfile_instructions(path)
        if keyword == "FROM" and ":" in args  # the others: a stage, or the torch image
    }
    assert bases == {PYTHON_BASE_IMAGE, TRITON_BASE_IMAGE}
    script = (REPO_ROOT / "scripts" / "docker_bases.sh").read_text()
    for base in bases:
        pattern = base.split(":")[0] + ":" + ("*" if "/" in base else base.split(":")[1])
        assert f"    {pattern})" in script, f"no stand-in for {base}"
    assert "docker pull" in script  # the real base first, where its registry is reachable


# ---- a machine without a GPU ------------------------------------------------------------------


def test_no_env_file_runs_the_cpu_variant_and_one_line_of_env_example_the_gpu_one():
    example = (REPO_ROOT / ".env.example").read_text().splitlines()
    assert [line for line in example if line and line[0] != "#"] == [], "a copy of it changes nothing until edited"
    line = f"COMPOSE_FILE=compose.yaml:{GPU_OVERRIDE.relative_to(REPO_ROOT)}"
    assert f"# {line}" in example and line in node_env.env_file("original").splitlines(), "notebook 2's line"
    assert variant(cpu=True)["services"]["torch"]["build"]["args"]["CUDA_ARCH"] == ""  # skips the GPU check
    assert not (REPO_ROOT / "docker" / "compose.cpu.yaml").exists()


def fake_sysfs(root: Path, devices: dict[str, tuple[str, str]]) -> Path:
    for address, (vendor, device_class) in devices.items():
        folder = root / "bus" / "pci" / "devices" / address
        folder.mkdir(parents=True)
        (folder / "vendor").write_text(vendor + "\n")
        (folder / "class").write_text(device_class + "\n")
    return root


@pytest.mark.parametrize(
    ("devices", "env", "builds"),
    [
        ({"0000:00:01.0": ("0x8086", "0x060000"), "0000:00:02.0": ("0x10de", "0x040300")}, {}, False),
        ({"0000:00:01.0": ("0x8086", "0x060000"), "0000:3b:00.0": ("0x10de", "0x030200")}, {}, True),
        ({"0000:00:01.0": ("0x8086", "0x060000")}, {"GPU_BUILD_WITHOUT_GPU": "1"}, True),
    ],
    ids=["no-nvidia-gpu", "a-p100", "told-to-build-anyway"],
)
def test_the_gpu_build_stops_first_on_a_machine_without_a_gpu_naming_the_env_line(tmp_path, devices, env, builds):
    first_run = next(args for keyword, args in dockerfile_instructions(dockerfiles()[TORCH_IMAGE]) if keyword == "RUN")
    assert "docker/require_gpu.sh" in first_run and 'if [ -n "$CUDA_ARCH" ]' in first_run
    sysfs = fake_sysfs(tmp_path, devices)
    command = ["sh", str(REPO_ROOT / "docker" / "require_gpu.sh")]
    done = subprocess.run(
        command, env={"PATH": os.environ["PATH"], "SYSFS": str(sysfs), **env}, capture_output=True, text=True
    )
    assert (done.returncode == 0) == builds, done.stderr
    # Stopped: told to run compose.yaml alone, without the line that names the GPU variant.
    told = "use compose.yaml alone" in done.stderr and "delete the COMPOSE_FILE line from .env" in done.stderr
    assert told == (not builds)


# ---- what each image installs: the lock's versions ------------------------------------------


# Where an image installs outside the lock, and why (its Dockerfile says so too).
GPU_ONLY = {
    "onnxruntime-gpu": "ONNX Runtime's GPU build: the lock is made on a machine without a GPU",
    "nvidia-cudnn-cu12": "cuDNN 9.10.2, the last with Pascal code, pinned by the Dockerfiles' CUDNN",
}
# The PyTorch step: the lock's torch and torchvision, from the variant's index (cu126, cpu), whose
# builds and dependencies differ from the registry's; numpy 1.x until the image's locked step.
TORCH_STEP = re.compile(r"grep -E '\^\(torch\|torchvision\)==' /src/requirements\.lock > /tmp/torch\.txt")
TORCH_STEP_ARGS = {"${TORCH_INDEX_URL:+--index-url", "$TORCH_INDEX_URL}", "-r", "/tmp/torch.txt", "numpy<2"}
VARIANT_ARGS = {"${ONNXRUNTIME}", "${CUDNN:+$CUDNN}"}  # as the shell sees them, quotes removed
# The one line of the lock an image may leave out: a CUDA build of PyTorch pins its own CUDA runtime.
LEFT_OUT = "grep -v '^nvidia-cuda-runtime-cu12==' /src/requirements.lock > /tmp/constraints.txt"
# Triton's image runs Ubuntu 22.04's Python 3.10: its lock is the lock's versions but where the lock's
# release has no build for 3.10, each named here with why (docker/Dockerfile.triton says so too).
TRITON_LOCK = REPO_ROOT / "docker" / "triton-py310.lock"
OLDER_FOR_PY310 = {
    "pillow": "Pillow 13 needs Python 3.11: 12.3 is its last release for 3.10",
    "onnxruntime": "ONNX Runtime 1.24 and later need Python 3.11: 1.23 is its last release for 3.10",
    "coloredlogs": "onnxruntime 1.23's own dependency (later releases dropped it)",
    "humanfriendly": "coloredlogs' own dependency",
}


def pip_installs(text: str) -> list[list[str]]:
    """The arguments of each `pip install` in a RUN's shell text, up to the end of its command."""
    commands = re.split(r"&&|;|\bthen\b|\belse\b", text)
    return [
        shlex.split(command.split(" install", 1)[1]) for command in commands if re.search(r"\bpip3? install\b", command)
    ]


def packages_named(arguments: list[str]) -> list[str]:
    """What a pip install names to install: its arguments less the options and their values."""
    named, skip = [], False
    for arg in arguments:
        if skip or arg.startswith("-"):
            skip = arg in ("-c", "-r", "--index-url")
            continue
        named.append(arg)
    return named


@pytest.mark.parametrize("image", sorted(dockerfiles()))
def test_every_pip_install_of_an_image_is_at_the_lock_s_versions_or_a_named_variant_build(image):
    extras_seen = []
    for keyword, args in dockerfile_instructions(dockerfiles()[image]):
        if keyword != "RUN":
            continue
        for arguments in pip_installs(args):
            if "--no-deps" in arguments:  # the lab's own package, after its dependencies
                assert packages_named(arguments) in (["/src"], ["."]), arguments
            elif "-r" in arguments:
                assert TORCH_STEP.search(args), f"{image}: -r of anything but the lock's torch lines"
                assert set(arguments) <= TORCH_STEP_ARGS | VARIANT_ARGS, arguments
            else:
                constraint = arguments[arguments.index("-c") + 1] if "-c" in arguments else None
                assert (
                    constraint == "/src/requirements.lock"
                    or (constraint == "/tmp/constraints.txt" and LEFT_OUT in args)
                    or (image == "triton" and constraint == f"/src/{TRITON_LOCK.name}")
                ), f"{image}: `pip install {' '.join(arguments)}` is not constrained by the lock"
                for package in packages_named(arguments):
                    if package in VARIANT_ARGS:
                        continue  # checked below, in each variant
                    extras = re.fullmatch(r"/src\[([a-z,-]+)\]", package)
                    assert extras, f"{image}: installs {package}, not an extra of pyproject.toml"
                    assert set(extras.group(1).split(",")) <= set(EXTRAS), package
                    extras_seen.append(package)
    assert image == "torch" or extras_seen, f"{image}: installs nothing from pyproject.toml"


@pytest.mark.parametrize("cpu", [False, True], ids=["gpu", "cpu"])
def test_the_runtimes_each_variant_picks_are_the_lock_s_or_a_gpu_build_named_with_why(cpu):
    pins = lock_pins()
    for name, service in variant(cpu)["services"].items():
        defaults = dict(
            value.split("=", 1)
            for keyword, value in dockerfile_instructions(dockerfiles()[name])
            if keyword == "ARG" and "=" in value
        )
        args = {**{key: value.strip('"') for key, value in defaults.items()}, **service["build"].get("args", {})}
        for arg in ("ONNXRUNTIME", "CUDNN"):
            if not args.get(arg):
                continue
            requirement = Requirement(args[arg])
            package = canonicalize_name(requirement.name)
            if cpu:
                assert package in pins and not requirement.specifier, f"{name}: {arg}={args[arg]}: the lock pins it"
            else:
                assert package in GPU_ONLY or package in pins, f"{name}: {arg}={args[arg]}"


def test_triton_s_lock_for_python_3_10_is_the_lock_but_for_the_releases_3_10_lacks():
    """docker/triton-py310.lock (`make lock`) may differ from requirements.lock only where the
    lock's release has no build for Python 3.10, and only to an older release."""
    pins, differing = lock_pins(), {}
    for line in TRITON_LOCK.read_text().splitlines():
        if line and not line.startswith((" ", "#")):
            name, _, version = line.partition("==")
            package = canonicalize_name(name)
            if pins.get(package) != Version(version):
                differing[package] = version
                assert package not in pins or Version(version) < pins[package], f"{package}: newer than the lock's"
    assert set(differing) == set(OLDER_FOR_PY310), f"differs from requirements.lock: {differing}; see OLDER_FOR_PY310"
    extra = [canonicalize_name(Requirement(requirement).name) for requirement in EXTRAS["triton"]]
    assert all(package in TRITON_LOCK.read_text() for package in extra), "the `triton` extra, whole: run `make lock`"
