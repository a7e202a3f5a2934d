"""Static checks of the Dockerfiles and Docker Compose files.

There is no Docker engine where these tests run, so nothing is built: the compose files are
parsed with PyYAML and the Dockerfiles read as text, and what `docker compose build` / `up`
would trip over on the GPU node is checked here instead: build contexts and Dockerfiles that
exist (for every value of the switch variables), COPY sources inside their context, ports,
environment, GPU reservations, pinned versions, no host-specific absolute paths.

The model files and the copies of the shared modules (servelab/food11.py, predict_api.py...) are generated into the
service folders by `make artifacts` and git-ignored, so these tests pass before that has run.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from collections import Counter
from pathlib import Path

import pytest
import yaml

from servelab.artifacts import SERVICE_MODULES

REPO_ROOT = Path(__file__).resolve().parent.parent
DOCKER_DIR = REPO_ROOT / "docker"
FASTAPI_COMPOSE = DOCKER_DIR / "docker-compose-fastapi.yaml"
TRITON_COMPOSE = DOCKER_DIR / "docker-compose-triton.yaml"
COMPOSE_FILES = [FASTAPI_COMPOSE, TRITON_COMPOSE]

# Placed into the build contexts by `make artifacts`; a Dockerfile may name them although they
# are absent from a fresh clone.
SERVICE_COPIES = set(SERVICE_MODULES)
ONNX_SERVICE_COPIES = {*SERVICE_MODULES, "onnx_service.py"}
GENERATED_ARTIFACTS = {"food11.pth", "food11.onnx", *ONNX_SERVICE_COPIES}

# The environments each compose file must work under: the defaults, and every alternative the
# switch variables allow.
FASTAPI_ENVS = [{}, {"FASTAPI_SERVICE": "fastapi_pt"}, {"FASTAPI_SERVICE": "fastapi_onnx"}]
TRITON_ENVS = [
    {},
    {"FOOD11_MODEL_NAME": "food_classifier"},
    {"FOOD11_MODEL_NAME": "food_classifier_onnx"},
]
ENVS_BY_FILE = {FASTAPI_COMPOSE: FASTAPI_ENVS, TRITON_COMPOSE: TRITON_ENVS}

EXPECTED_PORTS = {
    FASTAPI_COMPOSE: {
        "fastapi_server": ["8000:8000"],
        "ray_serve": ["8500:8000"],
        "flask": ["80:5000"],
        "jupyter": ["8888:8888"],
        "image_host": [],  # reached by the services and notebooks on the Compose network only
    },
    TRITON_COMPOSE: {
        "triton_server": ["8000:8000", "8001:8001", "8002:8002"],
        "flask": ["80:5000"],
        "jupyter": ["8888:8888"],
        "image_host": [],
    },
}

EXPECTED_CONTAINER_NAMES = {
    FASTAPI_COMPOSE: {
        "fastapi_server": "fastapi_server",
        "ray_serve": "ray_serve",
        "flask": "flask",
        "jupyter": "jupyter",
        "image_host": "image_host",
    },
    TRITON_COMPOSE: {
        "triton_server": "triton_server",
        "flask": "flask",
        "jupyter": "jupyter",
        "image_host": "image_host",
    },
}

GPU_SERVICES = {FASTAPI_COMPOSE: ["fastapi_server"], TRITON_COMPOSE: ["triton_server"]}

# Required environment, as the containers see it with no variable set on the host.
REQUIRED_ENV = {
    FASTAPI_COMPOSE: {
        "fastapi_server": {"IMAGE_URL_ALLOWED_HOSTS": "image_host:8000"},
        "flask": {"FASTAPI_SERVER_URL": "http://fastapi_server:8000"},
        "jupyter": {
            "LAB_TARGET": "chameleon",
            "FASTAPI_SERVER_URL": "http://fastapi_server:8000",
            "IMAGE_HOST_URL": "http://image_host:8000",
        },
    },
    TRITON_COMPOSE: {
        "flask": {"TRITON_SERVER_URL": "triton_server:8000", "FOOD11_MODEL_NAME": "food_classifier"},
        "jupyter": {
            "LAB_TARGET": "chameleon",
            "TRITON_SERVER_URL": "triton_server:8000",
            "IMAGE_HOST_URL": "http://image_host:8000",
        },
    },
}

TRITON_BASE_IMAGE = "nvcr.io/nvidia/tritonserver:24.12-py3"


# --------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------

_VAR_RE = re.compile(
    r"\$\$"  # escaped dollar
    r"|\$\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}"
    r"|\$(?P<bare>[A-Za-z_][A-Za-z0-9_]*)"
)


def expand_vars(text: str, env: dict[str, str]) -> str:
    """Expand variables the way Docker Compose interpolates a value.

    `${VAR:-default}` (default when VAR is unset or empty), `${VAR-default}` (default when
    unset), `${VAR}` and `$VAR` (empty when unset), `$$` (a literal `$`). `${VAR:?err}` and
    `${VAR?err}` raise KeyError when the variable is missing, as Compose refuses to start.
    """

    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group("braced") or match.group("bare")
        op, arg = match.group("op"), match.group("arg") or ""
        value = env.get(name)
        if op == ":-":
            return value if value else arg
        if op == "-":
            return arg if value is None else value
        if op in (":?", "?"):
            if value is None or (op == ":?" and not value):
                raise KeyError(f"{name}: {arg}")
            return value
        return value or ""

    return _VAR_RE.sub(replace, text)


def load_compose(path: Path, env: dict[str, str] | None = None) -> dict:
    """Parse a compose file after interpolating it with `env` (nothing set by default)."""
    return yaml.safe_load(expand_vars(path.read_text(), env or {}))


def services(path: Path, env: dict[str, str] | None = None) -> dict:
    return load_compose(path, env)["services"]


def build_of(service: dict) -> tuple[str, str]:
    """(context, dockerfile) of a service's build, in Compose's short or long form."""
    build = service["build"]
    if isinstance(build, str):
        return build, "Dockerfile"
    return build.get("context", "."), build.get("dockerfile", "Dockerfile")


def dockerfile_instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, with comments dropped and continuation lines joined."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = pending + line
        pending = ""
        keyword, _, args = line.partition(" ")
        instructions.append((keyword.upper(), args.strip()))
    assert not pending, f"{path}: the last instruction ends with a line continuation"
    return instructions


def copy_sources(args: str) -> list[str]:
    """The source paths of a COPY/ADD instruction, in shell or JSON form, flags dropped."""
    if args.startswith("["):
        parts = json.loads(args)
    else:
        parts = [p for p in shlex.split(args) if not p.startswith("--")]
    assert len(parts) >= 2, f"COPY needs a source and a destination: {args!r}"
    return parts[:-1]


def guarded_files(instructions: list[tuple[str, str]]) -> list[str]:
    """Files named by `test -f NAME` in RUN instructions (the 'run make artifacts' guards)."""
    names: list[str] = []
    for keyword, args in instructions:
        if keyword == "RUN":
            names += re.findall(r"test -f ([\w./-]+)", args)
    return names


def all_build_targets() -> list[tuple[Path, dict, str, Path, Path]]:
    """(compose file, env, service, context dir, Dockerfile) for every build in every env."""
    targets = []
    for compose, envs in ENVS_BY_FILE.items():
        for env in envs:
            for name, service in services(compose, env).items():
                if "build" not in service:
                    continue
                context, dockerfile = build_of(service)
                context_dir = (compose.parent / context).resolve()
                targets.append((compose, env, name, context_dir, context_dir / dockerfile))
    return targets


def distinct_dockerfiles() -> list[tuple[Path, Path]]:
    """(context dir, Dockerfile) pairs, each once."""
    seen: dict[Path, Path] = {}
    for _, _, _, context_dir, dockerfile in all_build_targets():
        seen.setdefault(dockerfile, context_dir)
    return [(context, dockerfile) for dockerfile, context in seen.items()]


def gitignored_names() -> set[str]:
    """Plain file patterns of the repository's .gitignore, by base name."""
    gitignore = REPO_ROOT / ".gitignore"
    if not gitignore.is_file():
        return set()
    names = set()
    for line in gitignore.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            names.add(line.rstrip("/").rsplit("/", 1)[-1])
    return names


def relative(path: Path) -> str:
    return str(path.relative_to(REPO_ROOT)) if path.is_relative_to(REPO_ROOT) else str(path)


def host_port(mapping: str) -> str:
    """The host side of a short-syntax port mapping ("80:5000", "127.0.0.1:80:5000", "8000")."""
    parts = str(mapping).split("/")[0].split(":")
    return parts[-2] if len(parts) >= 2 else parts[0]


def container_port(mapping: str) -> str:
    return str(mapping).split("/")[0].split(":")[-1]


def env_dict(service: dict) -> dict[str, str]:
    """A service's environment, in list or mapping form, as a dict."""
    environment = service.get("environment") or {}
    if isinstance(environment, list):
        return dict(item.split("=", 1) if "=" in item else (item, "") for item in environment)
    return {key: "" if value is None else str(value) for key, value in environment.items()}


# --------------------------------------------------------------------------------------------
# The variable-expansion helper itself
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "env", "expected"),
    [
        ("../${FASTAPI_SERVICE:-fastapi_pt}", {}, "../fastapi_pt"),
        ("../${FASTAPI_SERVICE:-fastapi_pt}", {"FASTAPI_SERVICE": "fastapi_onnx"}, "../fastapi_onnx"),
        ("../${FASTAPI_SERVICE:-fastapi_pt}", {"FASTAPI_SERVICE": ""}, "../fastapi_pt"),
        ("${X-fallback}", {"X": ""}, ""),
        ("${X-fallback}", {}, "fallback"),
        ("${X}/$Y", {"X": "a", "Y": "b"}, "a/b"),
        ("${X}", {}, ""),
        ("cost: $$5", {}, "cost: $5"),
        ("${A:-1}-${B:-2}", {"B": "x"}, "1-x"),
    ],
)
def test_expand_vars(text, env, expected):
    assert expand_vars(text, env) == expected


def test_expand_vars_required_variable_missing():
    with pytest.raises(KeyError):
        expand_vars("${NEEDED:?set NEEDED}", {})
    assert expand_vars("${NEEDED:?set NEEDED}", {"NEEDED": "ok"}) == "ok"


# --------------------------------------------------------------------------------------------
# Compose files: structure, build contexts, Dockerfiles
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("compose", COMPOSE_FILES, ids=lambda p: p.name)
def test_compose_file_parses_with_expected_services(compose):
    assert compose.is_file(), f"{relative(compose)} is missing"
    assert set(services(compose)) == set(EXPECTED_PORTS[compose])


@pytest.mark.parametrize("compose", COMPOSE_FILES, ids=lambda p: p.name)
def test_container_names(compose):
    for name, service in services(compose).items():
        assert service.get("container_name") == EXPECTED_CONTAINER_NAMES[compose][name], name


@pytest.mark.parametrize(
    ("compose", "env", "service", "context_dir", "dockerfile"),
    all_build_targets(),
    ids=lambda v: (
        v.name
        if isinstance(v, Path)
        else (",".join(f"{k}={x}" for k, x in v.items()) or "defaults")
        if isinstance(v, dict)
        else str(v)
    ),
)
def test_build_context_and_dockerfile_exist(compose, env, service, context_dir, dockerfile):
    assert context_dir.is_dir(), f"{compose.name} {service} {env}: build context {context_dir} does not exist"
    assert context_dir.is_relative_to(REPO_ROOT), f"{service}: build context {context_dir} is outside the repository"
    assert dockerfile.is_file(), f"{compose.name} {service} {env}: {relative(dockerfile)} does not exist"
    assert dockerfile.is_relative_to(context_dir), f"{service}: the Dockerfile must sit inside its build context"


def test_every_model_server_has_a_build():
    """Every service is built from this repository (none pulls an unpinned image by itself)."""
    for compose in COMPOSE_FILES:
        for name, service in services(compose).items():
            assert "build" in service, f"{compose.name}: {name} has no build section"


def test_fastapi_switch_selects_onnx_server():
    """FASTAPI_SERVICE=fastapi_onnx switches the server without editing the compose file."""
    default = services(FASTAPI_COMPOSE)["fastapi_server"]
    onnx = services(FASTAPI_COMPOSE, {"FASTAPI_SERVICE": "fastapi_onnx"})["fastapi_server"]

    default_dir = (DOCKER_DIR / build_of(default)[0]).resolve()
    onnx_dir = (DOCKER_DIR / build_of(onnx)[0]).resolve()
    assert default_dir == REPO_ROOT / "fastapi_pt"
    assert onnx_dir == REPO_ROOT / "fastapi_onnx"
    assert (onnx_dir / build_of(onnx)[1]).is_file()

    onnx_requirements = (onnx_dir / "requirements.txt").read_text().lower()
    assert "onnxruntime" in onnx_requirements
    assert not re.search(r"^torch\b", onnx_requirements, re.M), "the ONNX server should not install torch"
    assert re.search(r"^torch\b", (default_dir / "requirements.txt").read_text(), re.M)

    # The two variants are tagged apart, so building one does not overwrite the other.
    assert default.get("image") != onnx.get("image")


def test_fastapi_switch_to_unknown_service_gives_missing_context():
    """The switch really substitutes: a name that is no service folder leads nowhere."""
    bogus = services(FASTAPI_COMPOSE, {"FASTAPI_SERVICE": "no_such_service"})["fastapi_server"]
    assert not (DOCKER_DIR / build_of(bogus)[0]).resolve().exists()


def test_triton_switch_selects_model():
    """FOOD11_MODEL_NAME switches the model GourmetGram asks Triton for; each one is staged."""
    for model in ("food_classifier", "food_classifier_onnx"):
        flask = services(TRITON_COMPOSE, {"FOOD11_MODEL_NAME": model})["flask"]
        assert env_dict(flask)["FOOD11_MODEL_NAME"] == model
        assert (REPO_ROOT / "models_staging" / model).is_dir(), f"models_staging/{model} is missing"


# --------------------------------------------------------------------------------------------
# Dockerfiles: COPY sources, artifact guards, ports, commands
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("context_dir", "dockerfile"), distinct_dockerfiles(), ids=lambda p: relative(p))
def test_copy_sources_exist_in_context_or_are_generated(context_dir, dockerfile):
    instructions = dockerfile_instructions(dockerfile)
    for keyword, args in instructions:
        if keyword not in ("COPY", "ADD") or "--from=" in args:
            continue
        for source in copy_sources(args):
            resolved = (context_dir / source).resolve()
            assert resolved.is_relative_to(context_dir), (
                f"{relative(dockerfile)}: COPY {source} leaves the build context"
            )
            assert resolved.exists() or Path(source).name in GENERATED_ARTIFACTS, (
                f"{relative(dockerfile)}: COPY source {source} is neither in {relative(context_dir)} "
                f"nor a generated artifact"
            )


@pytest.mark.parametrize(("context_dir", "dockerfile"), distinct_dockerfiles(), ids=lambda p: relative(p))
def test_guarded_files_exist_or_are_generated_and_gitignored(context_dir, dockerfile):
    ignored = gitignored_names()
    for name in guarded_files(dockerfile_instructions(dockerfile)):
        if (context_dir / name).exists():
            continue
        assert name in GENERATED_ARTIFACTS, f"{relative(dockerfile)}: guard names {name}, which nothing provides"
        if ignored:
            assert name in ignored, f"{name} is generated but not git-ignored"


@pytest.mark.parametrize(
    ("service_dir", "artifacts"),
    [
        ("fastapi_pt", {"food11.pth", *SERVICE_COPIES}),
        ("fastapi_onnx", {"food11.onnx", *ONNX_SERVICE_COPIES}),
    ],
)
def test_fastapi_dockerfile(service_dir, artifacts):
    dockerfile = REPO_ROOT / service_dir / "Dockerfile"
    instructions = dockerfile_instructions(dockerfile)
    keywords = [k for k, _ in instructions]
    text = dockerfile.read_text()

    assert instructions[0] == ("FROM", "python:3.11-slim")
    # Every artifact the app loads or imports is checked, with a message that says what to do.
    assert set(guarded_files(instructions)) == artifacts
    assert "make artifacts" in text
    assert ("EXPOSE", "8000") in instructions
    cmd = json.loads(dict(instructions)["CMD"])
    assert cmd[:2] == ["uvicorn", "app:app"]
    assert cmd[cmd.index("--port") + 1] == "8000" and cmd[cmd.index("--host") + 1] == "0.0.0.0"
    # The app's own code goes in after the packages: code edits must not reinstall torch.
    copies = [i for i, k in enumerate(keywords) if k == "COPY"]
    runs = [i for i, (k, a) in enumerate(instructions) if k == "RUN" and "-r requirements.txt" in a]
    assert runs and copies[0] < runs[0] < copies[-1]
    assert (REPO_ROOT / service_dir / "app.py").is_file()


def test_ray_serve_dockerfile_runs_the_serve_config_with_every_module_guarded():
    dockerfile = REPO_ROOT / "ray_serve" / "Dockerfile"
    instructions = dockerfile_instructions(dockerfile)
    assert set(guarded_files(instructions)) == {"food11.onnx", *ONNX_SERVICE_COPIES}
    assert json.loads(dict(instructions)["CMD"]) == ["sh", "start.sh"]
    assert ("EXPOSE", "8000") in instructions
    start = (REPO_ROOT / "ray_serve" / "start.sh").read_text()
    assert subprocess.run(["sh", "-n", REPO_ROOT / "ray_serve" / "start.sh"]).returncode == 0
    assert "serve deploy serve_config.yaml" in start and "--metrics-export-port 8080" in start
    requirements = (REPO_ROOT / "ray_serve" / "requirements.txt").read_text()
    assert "ray[serve]==2.60.0" in requirements and "onnxruntime-gpu" in requirements
    config = yaml.safe_load((REPO_ROOT / "ray_serve" / "serve_config.yaml").read_text())
    assert config["http_options"]["port"] == 8000
    (deployment,) = config["applications"][0]["deployments"]
    assert deployment["ray_actor_options"]["num_gpus"] == 1  # a GPU per replica on the node


def test_notebook_8_reaches_serve_s_rest_api_and_metrics_on_the_compose_network_with_the_token():
    compose = yaml.safe_load((REPO_ROOT / "docker" / "docker-compose-fastapi.yaml").read_text())
    ray, jupyter = compose["services"]["ray_serve"], compose["services"]["jupyter"]
    assert ray["ports"] == ["8500:8000"]  # the dashboard and the metrics are not published on the host
    assert ray["environment"]["RAY_AUTH_MODE"] == "token"
    token = ray["environment"]["RAY_AUTH_TOKEN_PATH"]
    assert jupyter["environment"]["RAY_AUTH_TOKEN_PATH"] == token
    assert "ray-auth:/ray-auth" in ray["volumes"] and "ray-auth:/ray-auth:ro" in jupyter["volumes"]
    assert jupyter["environment"]["RAY_DASHBOARD_URL"] == "http://ray_serve:8265"
    assert jupyter["environment"]["RAY_METRICS_URL"] == "http://ray_serve:8080/metrics"
    assert "ray[serve]==2.60.0" in (REPO_ROOT / "docker" / "Dockerfile.jupyter").read_text()


def test_fastapi_pt_installs_torch_with_pascal_kernels():
    """The P100 (sm_60) needs the CUDA 12.6 wheels; PyPI's default build has no kernels for it."""
    instructions = dockerfile_instructions(REPO_ROOT / "fastapi_pt" / "Dockerfile")
    assert ("ARG", "TORCH_INDEX_URL=https://download.pytorch.org/whl/cu126") in instructions
    runs = [a for k, a in instructions if k == "RUN"]
    assert any('--index-url "${TORCH_INDEX_URL}" "torch<2.15"' in a for a in runs)


@pytest.mark.parametrize(
    ("service_dir", "must_have"),
    [
        ("fastapi_pt", ["torch", "torchvision", "fastapi", "uvicorn[standard]", "pydantic", "pillow", "numpy"]),
        ("fastapi_onnx", ["onnxruntime-gpu", "fastapi", "uvicorn[standard]", "pydantic", "pillow", "numpy"]),
    ],
)
def test_fastapi_requirements(service_dir, must_have):
    lines = [
        line.split("#", 1)[0].strip()
        for line in (REPO_ROOT / service_dir / "requirements.txt").read_text().splitlines()
    ]
    requirements = [line for line in lines if line and not line.startswith("-")]
    names = {re.split(r"[<>=!~;]", r, maxsplit=1)[0].strip().lower() for r in requirements}
    names |= {re.sub(r"\[.*\]", "", n) for n in names}
    for package in must_have:
        assert package.lower() in names, f"{service_dir}/requirements.txt lacks {package}"
    assert "numpy<2" in requirements, "numpy must stay on major 1, like the lab virtualenv"
    assert any(r.startswith("pydantic>=2") for r in requirements)


@pytest.mark.parametrize("service_dir", ["fastapi_onnx", "ray_serve"])
def test_onnx_requirements_pin_a_cuda12_onnxruntime_that_preloads_its_libraries(service_dir):
    """onnxruntime-gpu 1.26+ on PyPI is a CUDA 13 build, which cannot run on the P100; 1.21 is the
    first with preload_dlls(), which devices.py loads the pip CUDA and cuDNN libraries with."""
    text = (REPO_ROOT / service_dir / "requirements.txt").read_text()
    match = re.search(r"^onnxruntime-gpu(\[[^\]]*\])?(?P<spec>[^#\n]*)", text, re.M)
    assert match, "onnxruntime-gpu is not required"
    assert match.group(1) == "[cuda,cudnn]", "the CUDA and cuDNN libraries come from pip"
    spec = match.group("spec").replace(" ", "")
    assert "<1.26" in spec and ">=1.21" in spec


@pytest.mark.parametrize("service_dir", ["fastapi_pt", "fastapi_onnx", "ray_serve"])
def test_gpu_images_ask_for_the_gpu_and_set_no_library_path(service_dir):
    """Each GPU service image asks for the GPU, so that running on the CPU instead is reported as a
    fallback (devices.py). The pip CUDA libraries are found at start-up wherever Python installed
    them: a fixed site-packages path in LD_LIBRARY_PATH holds for one base image's layout only."""
    instructions = dockerfile_instructions(REPO_ROOT / service_dir / "Dockerfile")
    assert ("ENV", "INFERENCE_DEVICE=cuda") in instructions
    for keyword, args in instructions:
        assert "LD_LIBRARY_PATH" not in args and "site-packages" not in args, f"{service_dir}: {keyword} {args}"


def test_gourmetgram_dockerfile():
    dockerfile = REPO_ROOT / "gourmetgram" / "Dockerfile"
    instructions = dockerfile_instructions(dockerfile)
    assert instructions[0] == ("FROM", "python:3.11-slim")
    assert ("EXPOSE", "5000") in instructions
    assert json.loads(dict(instructions)["CMD"]) == ["python", "app.py"]
    # app.py imports the generated food11.py; the build checks for it.
    assert guarded_files(instructions) == ["food11.py"]
    assert "make artifacts" in dockerfile.read_text()
    assert (REPO_ROOT / "gourmetgram" / "app.py").is_file()


def test_published_container_ports_match_exposed_ports():
    """Each compose mapping targets a port the image EXPOSEs (catches 80:8000 for Flask)."""
    for compose in COMPOSE_FILES:
        for name, service in services(compose).items():
            context, dockerfile = build_of(service)
            instructions = dockerfile_instructions((compose.parent / context / dockerfile).resolve())
            exposed = {p for k, a in instructions if k == "EXPOSE" for p in a.split()}
            if not exposed:  # the Jupyter base image exposes 8888 itself
                assert name == "jupyter", f"{name}: its Dockerfile exposes no port"
                continue
            for mapping in service.get("ports", []):
                assert container_port(mapping) in exposed, f"{compose.name} {name}: {mapping} vs EXPOSE {exposed}"


# --------------------------------------------------------------------------------------------
# Ports, environment, GPUs, volumes
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("compose", COMPOSE_FILES, ids=lambda p: p.name)
def test_ports_as_expected(compose):
    for name, service in services(compose).items():
        assert [str(p) for p in service.get("ports", [])] == EXPECTED_PORTS[compose][name], name


@pytest.mark.parametrize("compose", COMPOSE_FILES, ids=lambda p: p.name)
def test_no_host_port_published_twice(compose):
    published = Counter(
        host_port(mapping) for service in services(compose).values() for mapping in service.get("ports", [])
    )
    duplicates = {port: n for port, n in published.items() if n > 1}
    assert not duplicates, f"{compose.name}: host ports published more than once: {duplicates}"


@pytest.mark.parametrize("compose", COMPOSE_FILES, ids=lambda p: p.name)
def test_required_environment(compose):
    found = services(compose)
    for name, required in REQUIRED_ENV[compose].items():
        environment = env_dict(found[name])
        for key, value in required.items():
            assert environment.get(key) == value, f"{compose.name} {name}: {key}={environment.get(key)!r}"


@pytest.mark.parametrize("compose", COMPOSE_FILES, ids=lambda p: p.name)
def test_backend_urls_point_at_a_service_of_the_same_file(compose):
    """FASTAPI_SERVER_URL / TRITON_SERVER_URL name a service here, on a port it listens on."""
    found = services(compose)
    checked = 0
    for name, service in found.items():
        for key, value in env_dict(service).items():
            if key not in ("FASTAPI_SERVER_URL", "TRITON_SERVER_URL"):
                continue
            target = re.sub(r"^https?://", "", value).rstrip("/")
            host, _, port = target.partition(":")
            assert host in found, f"{compose.name} {name}: {key} names {host}, which is no service here"
            assert port in {container_port(p) for p in found[host].get("ports", [])}, f"{key}={value}"
            checked += 1
    assert checked >= 2


def test_flask_waits_for_its_backend():
    fastapi_flask = services(FASTAPI_COMPOSE)["flask"]
    assert "fastapi_server" in fastapi_flask["depends_on"]
    assert "triton_server" in services(TRITON_COMPOSE)["flask"]["depends_on"]
    # The FastAPI app answers /health only once its model is loaded.
    assert fastapi_flask["depends_on"]["fastapi_server"]["condition"] == "service_healthy"
    health = services(FASTAPI_COMPOSE)["fastapi_server"]["healthcheck"]["test"]
    assert "/health" in " ".join(health)


@pytest.mark.parametrize("compose", COMPOSE_FILES, ids=lambda p: p.name)
def test_gpu_reservations(compose):
    found = services(compose)
    for name in GPU_SERVICES[compose]:
        devices = found[name]["deploy"]["resources"]["reservations"]["devices"]
        assert any(
            d.get("driver") == "nvidia" and d.get("count") == "all" and "gpu" in d.get("capabilities", [])
            for d in devices
        ), f"{compose.name} {name}: no NVIDIA GPU reservation"


@pytest.mark.parametrize("compose", COMPOSE_FILES, ids=lambda p: p.name)
def test_jupyter_mounts_the_repository_clone(compose):
    jupyter = services(compose)["jupyter"]
    mounts = [str(v).split(":") for v in jupyter["volumes"]]
    assert ["..", "/home/jovyan/work"] in mounts
    assert (compose.parent / "..").resolve() == REPO_ROOT


@pytest.mark.parametrize("compose", COMPOSE_FILES, ids=lambda p: p.name)
def test_volume_sources_are_relative_and_exist(compose):
    for name, service in services(compose).items():
        for volume in service.get("volumes", []):
            source = str(volume).split(":")[0]
            assert not source.startswith(("/", "~")), f"{compose.name} {name}: absolute host path {source}"
            if source.startswith("."):
                assert (compose.parent / source).resolve().is_dir(), f"{compose.name} {name}: {source} missing"


def test_triton_service():
    triton = services(TRITON_COMPOSE)["triton_server"]
    assert "../models_staging:/models" in triton["volumes"]
    # The Python backend moves tensors through /dev/shm; Docker's default is 64 MB.
    shm = str(triton["shm_size"]).lower()
    number, unit = re.fullmatch(r"(\d+)\s*([kmg])?b?", shm).groups()
    size_mb = int(number) * {"k": 1 / 1024, "m": 1, "g": 1024, None: 1 / 2**20}[unit]
    assert size_mb >= 1024, f"shm_size {shm} is too small for the Python backend"


def test_jupyter_reads_triton_s_log_from_a_volume_the_server_writes_it_to():
    compose = services(TRITON_COMPOSE)
    triton, jupyter = compose["triton_server"], compose["jupyter"]
    log_file = triton["environment"]["TRITON_LOG_FILE"]
    assert jupyter["environment"]["TRITON_LOG_FILE"] == log_file
    folder = str(Path(log_file).parent)
    assert f"triton-log:{folder}" in triton["volumes"] and f"triton-log:{folder}:ro" in jupyter["volumes"]


@pytest.mark.parametrize("log_file_set", [True, False])
def test_triton_start_script_copies_the_output_and_passes_it_on(tmp_path, log_file_set):
    log_file = tmp_path / "logs" / "triton.log"
    env = {**os.environ, "TRITON_LOG_FILE": str(log_file) if log_file_set else ""}
    command = [str(DOCKER_DIR / "triton_log_copy.sh"), "sh", "-c", "echo to stdout; echo to stderr >&2; exit 3"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 3  # the server's exit status is the container's
    seen = done.stdout + done.stderr
    assert "to stdout" in seen and "to stderr" in seen  # `docker logs` still shows everything
    if log_file_set:
        assert log_file.read_text().splitlines() == ["to stdout", "to stderr"]
    else:
        assert not log_file.exists()


# --------------------------------------------------------------------------------------------
# Triton and Jupyter images
# --------------------------------------------------------------------------------------------


def test_triton_dockerfile():
    instructions = dockerfile_instructions(DOCKER_DIR / "Dockerfile.triton")
    assert instructions[0] == ("FROM", TRITON_BASE_IMAGE)
    assert [a for k, a in instructions if k == "FROM"] == [TRITON_BASE_IMAGE]

    cmd = json.loads(dict(instructions)["CMD"])
    # The start script copies the server's output to a file; the server is what it runs.
    assert cmd[:2] == ["/usr/local/bin/triton_log_copy.sh", "tritonserver"]
    assert ("COPY", "triton_log_copy.sh /usr/local/bin/triton_log_copy.sh") in instructions
    assert "--model-repository=/models" in cmd
    assert "--model-control-mode=explicit" in cmd
    # In explicit mode nothing loads at start-up unless named; `*` must be the only --load-model.
    assert [a for a in cmd if a.startswith("--load-model")] == ["--load-model=*"]

    runs = " ".join(a for k, a in instructions if k == "RUN")
    for package in ("torch", "torchvision", "pillow", '"numpy<2"'):
        assert package in runs, f"Dockerfile.triton does not install {package}"
    # torch for the P100 (sm_60): the CUDA 12.6 wheels, the index being a build argument.
    assert ("ARG", "TORCH_INDEX_URL=https://download.pytorch.org/whl/cu126") in instructions
    assert '--index-url "${TORCH_INDEX_URL}" "torch<2.15"' in runs


def test_jupyter_dockerfile():
    instructions = dockerfile_instructions(DOCKER_DIR / "Dockerfile.jupyter")
    base = instructions[0]
    assert base[0] == "FROM" and base[1].startswith("quay.io/jupyter/minimal-notebook:")
    assert not base[1].endswith(":latest")

    runs = " ".join(a for k, a in instructions if k == "RUN")
    assert re.search(r'"tritonclient\[all\]==2\.53\.0"', runs), "tritonclient must be pinned to 2.53.0"
    for package in ('"numpy<2"', "pillow", "requests", "matplotlib"):
        assert package in runs, f"Dockerfile.jupyter does not install {package}"
    assert "libb64-0d" in runs

    # apt runs as root; the image must end as the notebook user, not root.
    users = [a for k, a in instructions if k == "USER"]
    assert users[0] == "root" and users[-1] in ("${NB_USER}", "${NB_UID}", "jovyan", "1000")
    apt = next(i for i, (k, a) in enumerate(instructions) if k == "RUN" and "apt-get" in a)
    root = next(i for i, (k, a) in enumerate(instructions) if (k, a) == ("USER", "root"))
    assert root < apt


def test_triton_versions_match():
    """Server 24.12 is Triton 2.53.0, the first release with the fix for the gRPC cancellation crash
    (PR #7840); the client image pins the same release, on a base whose glibc runs its perf_analyzer.
    The local virtualenv keeps the release of its pip-installed server, 2.51.0."""
    server = (DOCKER_DIR / "Dockerfile.triton").read_text()
    client = (DOCKER_DIR / "Dockerfile.jupyter").read_text()
    assert "tritonserver:24.12-py3" in server
    assert "tritonclient[all]==2.53.0" in client and '"protobuf>=5.26.1,<6"' in client
    assert "tritonclient[all]==2.51.0" in (REPO_ROOT / "requirements.txt").read_text()
    # No site-packages path written in: the loader is told where pip put libcudart at build time.
    for keyword, args in dockerfile_instructions(DOCKER_DIR / "Dockerfile.jupyter"):
        assert "LD_LIBRARY_PATH" not in args and "site-packages" not in args, f"{keyword} {args}"


# --------------------------------------------------------------------------------------------
# No host-specific absolute paths
# --------------------------------------------------------------------------------------------


def docker_texts() -> list[Path]:
    files = sorted(p for p in DOCKER_DIR.iterdir() if p.is_file())
    files += [dockerfile for _, dockerfile in distinct_dockerfiles()]
    return sorted(set(files))


@pytest.mark.parametrize("path", docker_texts(), ids=lambda p: relative(p))
def test_no_absolute_host_paths(path):
    text = path.read_text()
    assert "/root/" not in text, f"{relative(path)} names /root/"
    # /home/jovyan is the notebook user's home inside the Jupyter image, not a host path.
    for match in re.finditer(r"/home/[^\s\"':]*", text):
        assert match.group(0).startswith(("/home/jovyan", "/home/${NB_USER}")), (
            f"{relative(path)} names a host path: {match.group(0)}"
        )


def test_no_absolute_host_path_detector_would_fire():
    """The check above does find a host path when one is there."""
    offending = "volumes:\n  - /home/cc/serve-system-chi:/home/jovyan/work\n"
    hits = [m.group(0) for m in re.finditer(r"/home/[^\s\"':]*", offending)]
    assert [h for h in hits if not h.startswith(("/home/jovyan", "/home/${NB_USER}"))] == ["/home/cc/serve-system-chi"]
