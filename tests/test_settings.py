"""The tooling's settings (servelab.settings): each variable read once, in one place, with a bad
value refused by name, and docs/settings.md's table of the variables generated from the same class."""

from __future__ import annotations

import ast
import dataclasses
import re
import subprocess
import sys
from pathlib import Path

import pytest

from servelab import paths
from servelab import settings as settings_module
from servelab.profiles import PROFILES
from servelab.service import devices
from servelab.settings import SettingError, Settings, markdown_table, repository_url
from servelab.stack.supervision import Ports
from servelab.triton.server import ONNX_RUNNER_SOURCE


def test_an_empty_environment_gives_the_defaults():
    chosen = Settings.from_environ({})
    assert chosen == Settings()
    assert (chosen.services, chosen.profile, chosen.inference_device, chosen.naive_runtime) == (
        "local",
        "full",
        "auto",
        "pytorch",
    )
    assert chosen.ports() == dataclasses.asdict(Ports())
    assert chosen.lab_dir is chosen.stack_dir is chosen.results_dir is chosen.checkpoint is None
    assert chosen.triton_shared_dir == Path("/triton") and chosen.progress  # progress bars are on by default


def test_each_variable_sets_its_field_and_an_empty_one_means_the_default():
    given = {
        "LAB_SERVICES": "compose",
        "LAB_PROFILE": "quick",
        "SERVELAB_RESULTS_DIR": "/tmp/somewhere",
        "SERVELAB_PORT_TRITON_GRPC": "9201",
        "FOOD11_CHECKPOINT": "/models/food11.pth",
        "FOOD11_CHECKPOINT_SHA256": "AB" * 32,
        "INFERENCE_DEVICE": "CPU",
        "RAY_SERVE_URL": "http://ray_serve:8000",
        "LAB_PROFILE_UNRELATED": "x",
        "SERVELAB_PORT_JUPYTER": "  ",
        "LAB_PROGRESS": "OFF",
    }
    chosen = Settings.from_environ(given)
    assert (chosen.services, chosen.profile, chosen.results_dir) == ("compose", "quick", Path("/tmp/somewhere"))
    assert chosen.port_triton_grpc == 9201 and chosen.port_jupyter == Settings.port_jupyter
    assert chosen.checkpoint_sha256 == "ab" * 32 and chosen.inference_device == "cpu" and not chosen.progress
    assert chosen.compose("ray_serve_url") == "http://ray_serve:8000"


@pytest.mark.parametrize(
    "variable, value, takes",
    [
        ("LAB_SERVICES", "node", "local, compose, chameleon"),
        ("LAB_PROFILE", "fast", "full, quick"),
        ("SERVELAB_PORT_FASTAPI_PT", "http", "1 to 65535"),
        ("SERVELAB_PORT_RAY_SERVE", "70000", "1 to 65535"),
        ("SERVELAB_PORT_IMAGE_HOST", "0", "1 to 65535"),
        ("SERVELAB_PORT_GOURMETGRAM", "-1", "1 to 65535"),
        ("FOOD11_CHECKPOINT_SHA256", "abc123", "64 hex digits"),
        ("FOOD11_CHECKPOINT_GIT_BLOB", "b550214", "40 hex digits"),
        ("INFERENCE_DEVICE", "gpu", "auto, cuda, cpu"),
        ("NAIVE_RUNTIME", "tensorflow", "pytorch, onnxruntime"),
        ("LAB_PROGRESS", "maybe", "on, off"),
    ],
)
def test_a_bad_value_is_refused_naming_the_variable_and_what_it_takes(variable, value, takes):
    with pytest.raises(SettingError, match=re.escape(f"{variable}={value!r}") + ".*" + re.escape(takes)):
        Settings.from_environ({variable: value})


@pytest.mark.parametrize(
    "given, says",
    [
        ({"FOOD11_CHECKPOINT": "/m/food11.pth"}, "FOOD11_CHECKPOINT=/m/food11.pth was given without a digest"),
        (
            {
                "FOOD11_CHECKPOINT": "/m/food11.pth",
                "FOOD11_CHECKPOINT_SHA256": "a" * 64,
                "FOOD11_CHECKPOINT_GIT_BLOB": "b" * 40,
            },
            "two digests.*set exactly one of them",
        ),
        ({"FOOD11_CHECKPOINT": "original", "FOOD11_CHECKPOINT_SHA256": "a" * 64}, "its own git blob id: unset"),
        ({"FOOD11_CHECKPOINT_GIT_BLOB": "b" * 40}, "set without FOOD11_CHECKPOINT"),
    ],
    ids=["no digest", "both digests", "original with a digest", "a digest alone"],
)
def test_a_checkpoint_takes_exactly_one_digest_and_original_none(given, says):
    with pytest.raises(SettingError, match=says):
        Settings.from_environ(given)


def test_a_checkpoint_with_one_digest_or_original_alone_is_taken():
    by_blob = Settings.from_environ({"FOOD11_CHECKPOINT": "/m/food11.pth", "FOOD11_CHECKPOINT_GIT_BLOB": "B" * 40})
    assert (by_blob.checkpoint, by_blob.checkpoint_sha256, by_blob.checkpoint_git_blob) == (
        "/m/food11.pth",
        None,
        "b" * 40,
    )
    assert Settings.from_environ({"FOOD11_CHECKPOINT": "original"}).checkpoint == "original"


def test_lab_target_was_renamed_and_says_so():
    with pytest.raises(SettingError, match="LAB_TARGET was renamed LAB_SERVICES.*LAB_SERVICES=compose"):
        Settings.from_environ({"LAB_TARGET": "compose", "LAB_SERVICES": "compose"})


def test_a_compose_address_that_is_not_set_names_its_variable():
    with pytest.raises(SettingError, match="FASTAPI_PT_URL is not set.*Jupyter container"):
        Settings.from_environ({"LAB_SERVICES": "compose"}).compose("fastapi_pt_url")


def test_the_choices_are_those_of_the_code_that_uses_them():
    assert Settings.from_environ({}).profile in PROFILES
    for name in PROFILES:
        assert Settings.from_environ({"LAB_PROFILE": name}).profile == name
    for device in devices.CHOICES:  # the in-process ceiling asks for a device as the services do
        assert Settings.from_environ({"INFERENCE_DEVICE": device}).inference_device == device


def test_a_process_reads_its_settings_once_and_its_paths_follow_them(tmp_path):
    """A child process with moved folders and ports: the paths and the ports come from them."""
    script = (
        "from servelab import paths; from servelab.stack.supervision import Ports\n"
        "print(paths.RESULTS_DIR, paths.LOG_DIR, paths.ARTIFACTS_DIR, Ports.configured().fastapi_onnx)"
    )
    env = {
        "PATH": "/usr/bin:/bin",
        "SERVELAB_DIR": str(tmp_path / "lab"),
        "SERVELAB_STACK_DIR": str(tmp_path / "stack"),
        "SERVELAB_RESULTS_DIR": str(tmp_path / "results"),
        "SERVELAB_PORT_FASTAPI_ONNX": "9101",
    }
    shown = subprocess.run(
        [sys.executable, "-c", script], env=env, cwd=paths.REPO_ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    assert shown == [
        str(tmp_path / "results"),
        str(tmp_path / "stack" / "logs"),
        str(tmp_path / "lab" / "artifacts"),
        "9101",
    ]


def test_a_bad_value_stops_the_command_line_with_the_message_only():
    env = {"PATH": "/usr/bin:/bin", "SERVELAB_PORT_TRITON_HTTP": "eighty"}
    ran = subprocess.run(
        [sys.executable, "-m", "servelab", "up"], env=env, cwd=paths.REPO_ROOT, capture_output=True, text=True
    )
    assert ran.returncode == 2
    assert "SERVELAB_PORT_TRITON_HTTP='eighty': set it to a TCP port" in ran.stderr and "Traceback" not in ran.stderr


# Variables the lab does not own, which the tooling reads where it needs them.
SYSTEM_VARIABLES = {
    "PATH",
    "LD_LIBRARY_PATH",
    "DISPLAY",
    "WAYLAND_DISPLAY",
    "MPLBACKEND",
    "PYTHONPATH",
    "JUPYTER_CONFIG_PATH",
}


def environment_reads(tree: ast.AST) -> list[tuple[int, str]]:
    """Each read of os.environ / os.getenv in `tree`: (line, the variable's name, or "?" when it is
    not a constant)."""

    def is_environ(node: ast.AST) -> bool:
        return isinstance(node, ast.Attribute) and node.attr == "environ"

    def name(node: ast.AST | None) -> str:
        return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else "?"

    reads = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            reading = (node.func.attr == "get" and is_environ(node.func.value)) or node.func.attr == "getenv"
            if reading:
                reads.append((node.lineno, name(node.args[0] if node.args else None)))
        elif isinstance(node, ast.Subscript) and is_environ(node.value) and isinstance(node.ctx, ast.Load):
            reads.append((node.lineno, name(node.slice)))
        elif isinstance(node, ast.Compare) and any(is_environ(c) for c in node.comparators):
            reads.append((node.lineno, name(node.left)))
    return reads


def test_no_other_module_of_the_tooling_reads_a_variable_of_the_lab():
    """Outside servelab/settings.py the tooling reads only variables the lab does not own (PATH,
    DISPLAY...); the services (servelab/service) have settings of their own, and so does the
    Python-backend model that runs an ONNX graph in Triton (it reads the server's environment, as
    every model.py does)."""
    found = [
        f"{path.relative_to(paths.REPO_ROOT)}:{line} reads {variable}"
        for path in sorted((paths.REPO_ROOT / "servelab").rglob("*.py"))
        if path.name != "settings.py" and path.parent.name != "service" and path != ONNX_RUNNER_SOURCE
        for line, variable in environment_reads(ast.parse(path.read_text()))
        if variable not in SYSTEM_VARIABLES
    ]
    assert found == []
    assert environment_reads(ast.parse("os.environ.get('X'); os.getenv(k); os.environ['Y']; 'Z' in os.environ")) == [
        (1, "X"),
        (1, "?"),
        (1, "Y"),
        (1, "Z"),
    ]


def test_the_settings_page_lists_every_variable_as_the_settings_class_does():
    readme = (paths.REPO_ROOT / "docs" / "settings.md").read_text()
    start, end = "<!-- settings table: python scripts/build_settings_doc.py -->\n", "<!-- end of settings table -->"
    assert start in readme and end in readme, "docs/settings.md has lost the markers of its settings table"
    table = readme.split(start, 1)[1].split(end, 1)[0]
    assert table == markdown_table(), "the settings table is stale: run `python scripts/build_settings_doc.py`"


def service_variables(app: Path) -> set[str]:
    """The variables a service's app reads: through os.environ, and through its `setting(NAME, ...)`."""
    tree = ast.parse(app.read_text())
    read = {variable for _, variable in environment_reads(tree) if variable != "?"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setting":
            assert isinstance(node.args[0], ast.Constant), f"{app}:{node.lineno} names its variable"
            read.add(node.args[0].value)
    return read


def test_the_settings_page_lists_exactly_the_variables_the_services_read():
    page = (paths.REPO_ROOT / "docs" / "settings.md").read_text()
    services = page.split("The services read settings of their own", 1)[1].split("GourmetGram's settings", 1)[0]
    listed = set(re.findall(r"^\| `([A-Z0-9_]+)` \|", services, re.MULTILINE))
    apps = [paths.FASTAPI_PT_DIR / "app.py", paths.FASTAPI_ONNX_DIR / "app.py", paths.RAY_SERVE_DIR / "app.py"]
    read = set().union(*map(service_variables, apps))
    assert listed == read, f"listed, not read: {sorted(listed - read)}; read, not listed: {sorted(read - listed)}"
    assert {"PREDICT_CONCURRENCY", "ABANDON_ON_DISCONNECT", "WEB_CONCURRENCY"} <= read


def git(folder: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=folder, check=True, capture_output=True)


def test_the_repository_url_is_the_setting_else_the_clone_s_origin_as_https(tmp_path, monkeypatch):
    monkeypatch.setattr(settings_module, "settings", lambda: Settings.from_environ({}))
    git(tmp_path, "init", "-q")
    git(tmp_path, "remote", "add", "origin", "git@github.com:someone/serve-system.git")
    assert repository_url(tmp_path) == "https://github.com/someone/serve-system.git"
    chosen = Settings.from_environ({"SERVELAB_REPO_URL": "https://example.org/fork.git"})
    monkeypatch.setattr(settings_module, "settings", lambda: chosen)
    assert repository_url(tmp_path) == "https://example.org/fork.git"


@pytest.mark.parametrize("with_git", [False, True], ids=["a-copy-without-git", "a-clone-without-origin"])
def test_without_a_repository_url_it_stops_saying_where_to_set_it(tmp_path, monkeypatch, with_git):
    monkeypatch.setattr(settings_module, "settings", lambda: Settings.from_environ({}))
    if with_git:
        git(tmp_path, "init", "-q")
    with pytest.raises(SettingError, match="Set SERVELAB_REPO_URL to the lab's https:// address: in notebook 2"):
        repository_url(tmp_path)
