"""Setting up the node (servelab.node_setup): nvidia-smi's output read and judged (text captured on a
GPU machine, and a P100 node's in the same format), apt's lock waited for against a real process
holding it, automatic upgrades stopped by the very command the node runs (with `systemctl` and
`fuser` stand-ins on its PATH), the lease found by its id through python-chi's own lease functions
(the Blazar API behind them is an in-memory stand-in: no Chameleon here), a private registry's
login, and the student's work copied off, on a Python with tarfile's data filter and on one without.
"""

from __future__ import annotations

import datetime as dt
import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import chi.context
import chi.lease
import invoke
import pytest
from blazarclient.exception import BlazarClientException

from servelab import node_setup, paths
from servelab.node_setup import NodeProblem
from tests.helpers import file_module

cuda_arch = file_module(paths.REPO_ROOT / "docker" / "cuda_arch.py")

DATA = Path(__file__).parent / "data"
# The format as captured (tests/data/nvidia_smi_h100.txt, an H100 machine, driver 580.159.04):
# a gpu_p100 node under the CC-Ubuntu24.04-CUDA image's driver 560.
P100_NODE = "0, Tesla P100-PCIE-16GB, 6.0, 560.35.03\n1, Tesla P100-PCIE-16GB, 6.0, 560.35.03\n"
NO_DRIVER = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest "
    "NVIDIA driver is installed and running.\n"
)


def test_a_p100_node_passes_with_both_gpus_read():
    gpus = node_setup.check_gpus(P100_NODE)
    assert [(g.index, g.name, g.compute_capability, g.branch) for g in gpus] == [
        (0, "Tesla P100-PCIE-16GB", "6.0", 560),
        (1, "Tesla P100-PCIE-16GB", "6.0", 560),
    ]


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (NO_DRIVER, 'nvidia-smi lists no GPU; it said: "NVIDIA-SMI has failed'),
        (P100_NODE.splitlines()[0], "This node has GPU 0: Tesla P100-PCIE-16GB, compute capability 6.0; a gpu_p100"),
        ((DATA / "nvidia_smi_h100.txt").read_text(), "GPU 0: NVIDIA H100 80GB HBM3, compute capability 9.0"),
        (P100_NODE.replace("560.35.03", "590.44.01"), "R580, the last branch that supports Pascal GPUs"),
        (P100_NODE.replace("560.35.03", "550.127.05"), "predates R560: the lab's images run CUDA 12.6 code"),
    ],
    ids=["no-driver", "one-gpu", "an-h100-captured", "driver-past-pascal", "driver-too-old"],
)
def test_a_node_the_lab_cannot_use_fails_saying_why_and_what_to_do(text, says):
    with pytest.raises(NodeProblem, match=r"(Delete the server|install an R580|Start the server from)") as problem:
        node_setup.check_gpus(text)
    assert says in str(problem.value)


def test_the_captured_output_is_read_as_nvidia_smi_prints_it():
    (gpu,) = node_setup.parse_gpus((DATA / "nvidia_smi_h100.txt").read_text())
    assert (gpu.name, gpu.compute_capability, gpu.driver, gpu.branch) == (
        "NVIDIA H100 80GB HBM3",
        "9.0",
        "580.159.04",
        580,
    )
    assert "--query-gpu=index,name,compute_cap,driver_version --format=csv,noheader" in node_setup.NVIDIA_SMI


def test_the_first_driver_branch_is_the_one_whose_ptx_the_build_guard_accepts():
    # R560 is a CUDA 12.6 driver: the guard's default (docker/cuda_arch.py) is that driver's.
    assert (node_setup.FIRST_BRANCH, cuda_arch.NODE_DRIVER_CUDA) == (560, (12, 6))


# ---- apt's lock ---------------------------------------------------------------------------------


def hold_lock(path: Path, seconds: float) -> subprocess.Popen:
    """A process holding `path` open and locked, as apt and unattended-upgrades hold dpkg's lock."""
    script = (
        "import fcntl, sys, time; f = open(sys.argv[1], 'w'); fcntl.lockf(f, fcntl.LOCK_EX); "
        "print('locked', flush=True); time.sleep(float(sys.argv[2]))"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", script, str(path), str(seconds)], stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout.readline().strip() == "locked"
    return holder


@pytest.mark.skipif(shutil.which("fuser") is None, reason="no fuser (psmisc) here; Ubuntu's node has it")
def test_apt_waits_for_its_lock_saying_who_holds_it_then_runs(tmp_path):
    lock = tmp_path / "lock-frontend"
    holder = hold_lock(lock, 1.0)
    command = node_setup.wait_for_apt_then("echo apt ran", limit_s=30, locks=(str(lock),), sudo="", poll_s=0.1)
    done = subprocess.run(command, shell=True, capture_output=True, text=True, timeout=60)
    holder.wait()
    assert done.returncode == 0, done.stderr
    assert re.match(r"apt is locked by python\S* \(unattended-upgrades .*\): waiting, \d+ s so far", done.stdout)
    assert done.stdout.rstrip().endswith("apt ran")
    assert "DPkg::Lock::Timeout=900" in node_setup.apt_get("install -y nvtop")


@pytest.mark.skipif(shutil.which("fuser") is None, reason="no fuser (psmisc) here; Ubuntu's node has it")
def test_apt_gives_up_at_its_limit_saying_what_to_do(tmp_path):
    lock = tmp_path / "lock"
    holder = hold_lock(lock, 30)
    try:
        command = node_setup.wait_for_apt_then("echo apt ran", limit_s=1, locks=(str(lock),), sudo="", poll_s=0.1)
        done = subprocess.run(command, shell=True, capture_output=True, text=True, timeout=60)
    finally:
        holder.kill()
    assert done.returncode == 1 and "apt ran" not in done.stdout
    assert "apt is still locked by python" in done.stderr and "then run this cell again" in done.stderr


def stand_in(bin_dir: Path, name: str, script: str) -> None:
    """A command on the node's PATH that logs its call (to $CALLS) and runs `script`."""
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / name).write_text(f'#!/bin/sh\necho "{name} $*" >> "$CALLS"\n{script}\n')
    (bin_dir / name).chmod(0o755)


def test_automatic_upgrades_are_stopped_for_the_lease_then_apt_s_lock_is_waited_for(tmp_path):
    calls, config = tmp_path / "calls", tmp_path / "apt.conf.d" / "90servelab-lock-timeout"
    config.parent.mkdir()
    stand_in(tmp_path / "bin", "systemctl", "exit 0")
    # unattended-upgrade finishing its step: it holds dpkg's lock for the first two looks, then lets go.
    stand_in(tmp_path / "bin", "fuser", f'[ "$(grep -c ^fuser "$CALLS")" -le 2 ] && echo " {os.getpid()}"')
    command = node_setup.stop_apt_updates(limit_s=30, sudo="", apt_config=str(config), poll_s=0.1)
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "CALLS": str(calls)}
    done = subprocess.run(command, shell=True, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert calls.read_text().splitlines() == [
        "systemctl disable --now --no-block apt-daily.timer",
        "systemctl disable --now --no-block apt-daily-upgrade.timer",
        "systemctl disable --now --no-block unattended-upgrades.service",
        "systemctl stop --no-block apt-daily.service apt-daily-upgrade.service",
        *[f"fuser {' '.join(node_setup.APT_LOCKS)}"] * 3,  # held, held, free
    ]
    assert re.search(r"^apt is locked by python\S* \(unattended-upgrades .*\): waiting", done.stdout, re.M)
    assert done.stdout.rstrip().endswith("Automatic upgrades are stopped for the lease, and apt is free.")
    assert config.read_text() == 'DPkg::Lock::Timeout "30";\n'  # every apt-get waits too, Docker's script's


def test_a_unit_the_node_lacks_is_said_and_the_rest_goes_on(tmp_path):
    calls, config = tmp_path / "calls", tmp_path / "lock-timeout"
    stand_in(
        tmp_path / "bin",
        "systemctl",
        'case "$*" in *apt-daily.timer*) echo "Unit apt-daily.timer not found" >&2; exit 5;; esac',
    )
    stand_in(tmp_path / "bin", "fuser", "exit 1")
    command = node_setup.stop_apt_updates(sudo="", apt_config=str(config), poll_s=0.1)
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "CALLS": str(calls)}
    done = subprocess.run(command, shell=True, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "apt-daily.timer: not stopped (above); the lock wait covers it" in done.stdout
    assert len(calls.read_text().splitlines()) == 5 and config.is_file()


def test_the_node_runs_each_install_under_the_lock_wait_and_stops_upgrades_first():
    assert node_setup.install_docker().startswith("bash -c ") and "fuser" in node_setup.install_docker()
    assert node_setup.install_docker().rstrip("'").endswith(node_setup.INSTALL_DOCKER.replace("'", "'\"'\"'"))
    notebook = (paths.REPO_ROOT / "notebooks" / "2_bring_up_node.py").read_text()
    stop, docker = notebook.index("node_setup.stop_apt_updates()"), notebook.index("node_setup.install_docker()")
    assert stop < docker < notebook.index("node_setup.apt_get(")
    assert notebook.count("apt-get") == 0 and "get.docker.com" not in notebook, "every install goes through node_setup"


# ---- the lease, through python-chi ------------------------------------------------------------


class Blazar:
    """Blazar's lease API, in memory, as python-chi's client calls it (`blazar().lease`)."""

    def __init__(self):
        self.leases: dict[str, dict] = {}
        self.lease = self

    def create(self, name, start, end, reservations, events):
        now = dt.datetime(2026, 11, 27, 10, 0)
        lease_id = f"lease-{len(self.leases) + 1}"
        self.leases[lease_id] = {
            "id": lease_id,
            "name": name,
            "status": "ACTIVE",
            "user_id": "u",
            "project_id": "p",
            "created_at": f"{now:%Y-%m-%d %H:%M:%S}",
            "start_date": f"{now:%Y-%m-%dT%H:%M:%S.%f}",
            "end_date": f"{now + dt.timedelta(hours=3):%Y-%m-%dT%H:%M:%S.%f}",
            "reservations": [{"id": f"{lease_id}-hosts", "resource_type": "physical:host", **r} for r in reservations],
        }
        return self.leases[lease_id]

    def get(self, ref):
        if ref not in self.leases:
            raise BlazarClientException(f"lease {ref} not found", code=404)
        return self.leases[ref]

    def list(self):
        return list(self.leases.values())


@pytest.fixture
def blazar(monkeypatch):
    api = Blazar()
    monkeypatch.setattr(chi.lease, "blazar", lambda: api)
    monkeypatch.setattr(chi.context, "version", "1.0")  # as notebooks 1 and 2 pin it
    return api


def reserve(name: str) -> chi.lease.Lease:
    """Notebook 1's lease, as it makes it."""
    start = dt.datetime(2026, 11, 27, 10, 0, tzinfo=dt.timezone.utc)
    made = chi.lease.Lease(name, start_date=None, end_date=start + dt.timedelta(hours=3))
    made.add_node_reservation(amount=1, node_type="gpu_p100")
    made.submit(wait_for_active=False)
    return made


def test_one_name_for_every_lease_of_a_user_breaks_python_chi_s_lookup_by_name(blazar):
    first = reserve("serve_system_alice")
    blazar.leases[first.id]["status"] = "TERMINATED"  # the first lease ended; the student reserves again
    again = chi.lease.Lease("serve_system_alice", end_date=dt.datetime(2026, 11, 28, 13, 0))
    again.add_node_reservation(amount=1, node_type="gpu_p100")
    again.submit(wait_for_active=False, idempotent=True)  # python-chi takes the ended lease as absent
    assert again.id != first.id and len(blazar.leases) == 2
    with pytest.raises(Exception, match="Multiple leases found|Lease not found"):
        chi.lease.get_lease("serve_system_alice")


def test_each_lease_has_its_own_name_and_notebook_2_finds_it_by_the_id_notebook_1_kept(blazar, tmp_path):
    record = tmp_path / "chameleon_lease.json"
    assert node_setup.reusable_lease(chi.lease.get_lease, record) is None  # none made yet
    name = node_setup.lease_name("alice", dt.datetime(2026, 11, 27, 10, 5, tzinfo=dt.timezone.utc))
    assert name == "serve_system_alice_20261127_1005"
    made = reserve(name)
    node_setup.save_lease(made, record)
    # Notebook 1 run again: the lease it made is used, not a second one.
    assert node_setup.reusable_lease(chi.lease.get_lease, record).id == made.id and len(blazar.leases) == 1
    # Notebook 2, in a fresh kernel: found by id, whatever other lease has that name.
    reserve(name)
    found = chi.lease.get_lease(node_setup.lease_id("", record))
    assert (found.id, found.status, found.node_reservations[0]["id"]) == (made.id, "ACTIVE", f"{made.id}-hosts")
    assert node_setup.lease_id(" lease-from-horizon ", record) == "lease-from-horizon"


def test_an_ended_or_deleted_lease_is_not_reused_and_no_lease_at_all_says_what_to_do(blazar, tmp_path, capsys):
    record = tmp_path / "chameleon_lease.json"
    made = reserve("serve_system_bob_20261127_1005")
    node_setup.save_lease(made, record)
    blazar.leases[made.id]["status"] = "TERMINATED"
    assert node_setup.reusable_lease(chi.lease.get_lease, record) is None
    del blazar.leases[made.id]
    assert node_setup.reusable_lease(chi.lease.get_lease, record) is None
    assert "is TERMINATED: making a new one" in capsys.readouterr().out
    with pytest.raises(NodeProblem, match="run notebook 1's 'Create the lease' cell"):
        node_setup.lease_id("", tmp_path / "none.json")


# ---- the student's work, off the node -----------------------------------------------------------


class LocalConnection:
    """fabric's Connection, on this machine: `run` is invoke's (whose Connection.run fabric's extends)."""

    def run(self, command: str, **kwargs):
        return invoke.Context().run(command, **{"in_stream": False, **kwargs})  # pytest holds stdin

    def get(self, remote: str, local: str) -> None:
        shutil.copy(remote, local)


def test_the_notebooks_and_results_are_copied_off_the_node(tmp_path):
    clone = tmp_path / "node" / "serve-system"
    (clone / "notebooks").mkdir(parents=True)
    (clone / "notebooks" / "4_fastapi_bench.ipynb").write_text('{"cells": ["with outputs"]}')
    (clone / "results" / "notebooks").mkdir(parents=True)
    (clone / "results" / "notebooks" / "4_fastapi_bench.jsonl").write_text('{"name": "c=8"}\n')
    (clone / ".lab" / "node-build").mkdir(parents=True)
    (clone / ".lab" / "node-build" / "build.log").write_text("#7 [triton 2/5] RUN pip install torch\n")
    (clone / "compose.yaml").write_text("not copied\n")
    copied = node_setup.copy_off(LocalConnection(), str(clone), tmp_path / "here")
    assert sorted(copied) == [
        ".lab/node-build/build.log",
        "notebooks/4_fastapi_bench.ipynb",
        "results/notebooks/4_fastapi_bench.jsonl",
    ]  # state.json is not there yet: left out, not an error
    assert (tmp_path / "here" / "results/notebooks/4_fastapi_bench.jsonl").read_text() == '{"name": "c=8"}\n'
    assert not (tmp_path / "here" / "work.tar.gz").exists() and not (tmp_path / "here" / "compose.yaml").exists()


@pytest.mark.parametrize("data_filter", [True, False], ids=["tarfile-data-filter", "a-python-without-it"])
def test_the_copy_off_unpacks_on_any_python(tmp_path, monkeypatch, data_filter):
    if not data_filter:  # Python before 3.10.12 / 3.11.4: tarfile has no `filter`, no data_filter
        monkeypatch.delattr(tarfile, "data_filter")
    clone = tmp_path / "node" / "serve-system"
    (clone / "results" / "notebooks").mkdir(parents=True)
    (clone / "results" / "notebooks" / "3_fastapi.jsonl").write_text("{}\n")
    (clone / "notebooks").mkdir()
    (clone / "notebooks" / "3_fastapi.ipynb").write_text("{}")
    (clone / "notebooks" / "latest.ipynb").symlink_to("3_fastapi.ipynb")  # a link inside is kept
    copied = node_setup.copy_off(LocalConnection(), str(clone), tmp_path / "here")
    assert sorted(copied) == ["notebooks/3_fastapi.ipynb", "results/notebooks/3_fastapi.jsonl"]
    assert (tmp_path / "here" / "notebooks" / "latest.ipynb").read_text() == "{}"


def hostile_archive(path: Path, kind: str) -> Path:
    """An archive that would write outside where it is unpacked, the way `kind` says."""
    with tarfile.open(path, "w:gz") as tar:
        member = tarfile.TarInfo({"absolute": "/tmp/escaped", "dotdot": "results/../../escaped"}.get(kind, "link"))
        if kind in ("symlink", "hardlink"):
            member.type = tarfile.SYMTYPE if kind == "symlink" else tarfile.LNKTYPE
            member.linkname = "../../escaped" if kind == "symlink" else "/etc/passwd"
            tar.addfile(member)
        else:
            member.size = 3
            tar.addfile(member, io.BytesIO(b"bad"))
    return path


@pytest.mark.parametrize("data_filter", [True, False], ids=["tarfile-data-filter", "a-python-without-it"])
@pytest.mark.parametrize("kind", ["absolute", "dotdot", "symlink", "hardlink"])
def test_an_archive_that_would_write_outside_lands_nowhere_outside(tmp_path, monkeypatch, kind, data_filter):
    if not data_filter:
        monkeypatch.delattr(tarfile, "data_filter")
    archive = hostile_archive(tmp_path / "work.tar.gz", kind)
    try:
        node_setup.extract_inside(archive, tmp_path / "a" / "b")
    except ValueError as refused:  # checked member by member: nothing unpacked
        assert not data_filter and re.search(r"which would land outside .*: nothing was unpacked", str(refused))
        assert not list((tmp_path / "a" / "b").rglob("*"))
    except tarfile.TarError:  # the filter refuses `..` and links outside; it makes an absolute name relative
        assert data_filter
    else:
        assert data_filter, "without the filter, every hostile member is refused"
    assert not (tmp_path / "escaped").exists() and not (tmp_path / "a" / "escaped").exists()
    assert all(tmp_path / "a" / "b" in path.parents for path in (tmp_path / "a").rglob("*") if path.name != "b")


# ---- a private registry for the images ----------------------------------------------------------


@pytest.mark.parametrize(
    ("prefix", "registry"),
    [
        ("registry.example.org/course/servelab-", "registry.example.org"),
        ("localhost:5000/servelab-", "localhost:5000"),
        ("ghcr.io/a-course/servelab-", "ghcr.io"),
        ("acourse/servelab-", "docker.io"),  # Docker Hub: a user's repository
    ],
)
def test_the_registry_of_an_image_prefix_is_read_as_docker_reads_it(prefix, registry):
    assert node_setup.registry_of(prefix) == registry


def test_the_node_logs_in_to_a_private_registry_with_the_token_on_stdin_only(tmp_path, monkeypatch):
    calls = tmp_path / "calls"
    token = "s3cret-t0ken"
    stand_in(tmp_path / "bin", "docker", f'read -r given; [ "$given" = "{token}" ] && echo "Login Succeeded"')
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    monkeypatch.setenv("CALLS", str(calls))
    said = node_setup.docker_login(LocalConnection(), "registry.example.org/course/servelab-", "ta", token)
    assert said == "Login Succeeded"
    assert calls.read_text() == "docker login --username ta --password-stdin registry.example.org\n"
    with pytest.raises(NodeProblem, match=r"docker login to registry.example.org as ta failed: .*Check REGISTRY_USER"):
        node_setup.docker_login(LocalConnection(), "registry.example.org/course/servelab-", "ta", "wrong")
