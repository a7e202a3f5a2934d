"""Static checks of the Compose project: compose.yaml (the CPU variant), docker/compose.gpu.yaml
over it (the GPU variant) and docker/compose.registry.yaml (the images from a registry), as Compose
would read them, checked where no Docker engine runs (and by `docker compose config` where Compose
is installed). `make test-docker` builds and runs the CPU variant for real."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import jsonschema
import pytest

from servelab import node_env
from servelab.settings import Settings
from tests.helpers.compose import (
    COMPOSE,
    COMPOSE_SPEC_SCHEMA,
    GPU_LIBRARY_IMAGES,
    GPU_OVERRIDE,
    MODEL_FILES_IN_THE_TORCH_IMAGE,
    REGISTRY_OVERRIDE,
    REPO_ROOT,
    SERVICES,
    TORCH_CONTEXT,
    TORCH_IMAGE,
    MissingVariable,
    arg_defaults,
    dockerfile_instructions,
    dockerfiles,
    load,
    merge,
    published,
    variant,
)

GPU_SERVICES = {"fastapi_pt", "fastapi_onnx", "triton", "ray_serve", "jupyter"}
# The GPUs each service reserves on the two-GPU node: "all", or the ids of its own.
GPUS = {"fastapi_pt": ["0"], "fastapi_onnx": ["1"], "triton": "all", "ray_serve": "all", "jupyter": "all"}
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
    runs merge with the plain rules, and need Compose 2.22 (service: build contexts), which
    scripts/docker_engine.sh checks; only the registry's file, an instructor's, resets."""

    def tags(path: Path) -> set[str]:
        return set(re.findall(r"!(reset|override)\b", re.sub(r"#.*", "", path.read_text())))

    assert tags(COMPOSE) == tags(GPU_OVERRIDE) == set() and tags(REGISTRY_OVERRIDE) == {"reset"}
    assert "MIN_COMPOSE=2.22.0" in (REPO_ROOT / "scripts" / "docker_engine.sh").read_text()


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
        defaults = arg_defaults(name)
        given = {key: value for key, value in gpu[name]["build"]["args"].items() if key in variant_args}
        assert given == {key: defaults[key] for key in variant_args if key in defaults}, (
            f"{name}: the GPU variant builds with its Dockerfile's defaults"
        )
        assert cpu[name]["build"]["args"]["CUDNN"] == "" and cpu[name]["build"]["args"]["CUDA_ARCH"] == "", name
    for name in ("fastapi_pt", "fastapi_onnx", "ray_serve"):
        assert cpu[name]["environment"]["INFERENCE_DEVICE"] == "cpu"
        assert gpu[name]["environment"]["INFERENCE_DEVICE"] == "cuda"
        assert gpu[name]["environment"]["IMAGE_URL_ALLOWED_HOSTS"] == "image_host:8000"  # merged, not replaced


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


def test_no_env_file_runs_the_cpu_variant_and_one_line_of_env_example_the_gpu_one():
    example = (REPO_ROOT / ".env.example").read_text().splitlines()
    assert [line for line in example if line and line[0] != "#"] == [], "a copy of it changes nothing until edited"
    line = f"COMPOSE_FILE=compose.yaml:{GPU_OVERRIDE.relative_to(REPO_ROOT)}"
    assert f"# {line}" in example and line in node_env.env_file("original").splitlines(), "notebook 2's line"
