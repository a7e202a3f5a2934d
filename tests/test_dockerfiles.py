"""Static checks of the Dockerfiles, read as text: what `docker compose build` would trip over.
The model files are built inside the lab's PyTorch image (docker/Dockerfile.torch), which the other
images name `servelab-torch`: no Dockerfile copies a model file of the clone's."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement

from tests.helpers.compose import (
    EXTRAS,
    GPU_LIBRARY_IMAGES,
    MODEL_FILES_IN_THE_TORCH_IMAGE,
    PYTHON_BASE_IMAGE,
    REPO_ROOT,
    SERVICES,
    TORCH_CONTEXT,
    TORCH_IMAGE,
    TRITON_BASE_IMAGE,
    copy_sources,
    dockerfile_instructions,
    dockerfiles,
    variant,
)
from tests.helpers.fatbins import ALLOW_LIST, cuda_arch

# What the Triton image's first guard scans: the backends the lab loads, and the server's libraries.
TRITON_TREE = ["/opt/tritonserver/backends/python", "/opt/tritonserver/backends/onnxruntime", "/opt/tritonserver/lib"]


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


def test_every_guard_binds_the_guard_and_its_one_allow_list():
    guards = [
        (name, args)
        for name, dockerfile in dockerfiles().items()
        for keyword, args in dockerfile_instructions(dockerfile)
        if keyword == "RUN" and "cuda_arch.py" in args
    ]
    assert {name for name, _ in guards} == GPU_LIBRARY_IMAGES
    for name, args in guards:
        assert args.split(" if ")[0].split() == list(GUARD_MOUNTS), name
    # A line without its reason fails the guard (tests/test_cuda_arch.py).
    assert {"libcusparseLt.so*", "libcufftw.so*"} <= set(cuda_arch.read_allow_list(ALLOW_LIST))


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
        assert ("ENV", "INFERENCE_DEVICE=cuda") in instructions, "the image's own default: the GPU node's"
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
    instructions = dockerfile_instructions(dockerfiles()["jupyter"])  # FROM the torch image: test_compose_project
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
    """Notebooks 6 and 7 run nvidia-smi, which the NVIDIA container toolkit mounts where the driver
    capabilities include `utility` (its default, when unset): nothing narrows them, not the GPU
    reservation (Docker sets them from any capability besides `gpu`), its environment, or an ENV."""
    # Its GPU reservation (every GPU, capability `gpu` alone): test_compose_project.
    assert "NVIDIA_DRIVER_CAPABILITIES" not in variant(cpu=False)["services"]["jupyter"]["environment"]
    for image in ("jupyter", TORCH_IMAGE):
        environment = " ".join(
            args for keyword, args in dockerfile_instructions(dockerfiles()[image]) if keyword == "ENV"
        )
        assert "NVIDIA_DRIVER_CAPABILITIES" not in environment, image


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
