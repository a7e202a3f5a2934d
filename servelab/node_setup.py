"""Setting up the GPU node (notebooks 1 and 2, on Chameleon's Jupyter server): the checks and
commands that make a lease's first minutes fail fast, with what to do (its GPUs and driver, apt's
lock on a node that just booted, the lease found by id, a private registry's login), and its last
ones keep the student's work (`copy_off`).

Standard library only: Chameleon's Jupyter server has none of the lab's other packages. The
objects it takes (python-chi's leases, fabric's connections) are passed in by the notebooks.
"""

from __future__ import annotations

import io
import json
import re
import shlex
import tarfile
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

NVIDIA_SMI = "nvidia-smi --query-gpu=index,name,compute_cap,driver_version --format=csv,noheader 2>&1 || true"
GPUS = 2  # a gpu_p100 node
COMPUTE_CAPABILITY = "6.0"  # Pascal: the P100
# NVIDIA's R580 is the last driver branch that supports Pascal: a later one has no P100 driver.
LAST_PASCAL_BRANCH = 580
# The images run CUDA 12.6 code (Triton 24.10, PyTorch cu126), and their build guard accepts PTX up to
# CUDA 12.6's (docker/cuda_arch.py, NODE_DRIVER_CUDA): a 560 driver, the node image's.
FIRST_BRANCH = 560
NODE_IMAGE = "CC-Ubuntu24.04-CUDA"

# The lease this clone made (notebook 1), in the clone on Chameleon's Jupyter server (git-ignored).
LEASE_RECORD = Path(__file__).resolve().parent.parent / ".lab" / "chameleon_lease.json"
ENDED = ("TERMINATED", "DELETED", "ERROR")  # Blazar's statuses of a lease that gives no node any more


# ---- the GPUs, right after boot ---------------------------------------------------------------


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    compute_capability: str
    driver: str

    @property
    def branch(self) -> int:
        return int(self.driver.split(".")[0])


class NodeProblem(RuntimeError):
    """The node cannot run the lab as it is: the message says why, and what to do."""


def parse_gpus(text: str) -> list[Gpu]:
    """The GPUs of `nvidia-smi --query-gpu=index,name,compute_cap,driver_version --format=csv,noheader`;
    none where it printed something else (an error: no driver)."""
    gpus = []
    for line in text.splitlines():
        fields = [field.strip() for field in line.split(",")]
        if len(fields) == 4 and fields[0].isdigit() and re.fullmatch(r"\d+\.\d+", fields[2]):
            gpus.append(Gpu(int(fields[0]), fields[1], fields[2], fields[3]))
    return gpus


def check_gpus(text: str) -> list[Gpu]:
    """The node's GPUs from nvidia-smi's output (NVIDIA_SMI), or NodeProblem saying what is wrong and what to do."""
    gpus = parse_gpus(text)
    redo = (
        "Delete the server (Horizon: Compute > Instances > Delete Instance, or node.delete()), wait a minute, and "
        "run this notebook again from 'Start the server'"
    )
    if not gpus:
        raise NodeProblem(
            f'nvidia-smi lists no GPU; it said: "{text.strip()[:300]}". The NVIDIA driver did not load: check that '
            f"the server was started from {NODE_IMAGE}. {redo}; if it happens again, ask Chameleon's help desk."
        )
    described = "; ".join(f"GPU {g.index}: {g.name}, compute capability {g.compute_capability}" for g in gpus)
    if len(gpus) != GPUS or any(g.compute_capability != COMPUTE_CAPABILITY for g in gpus):
        raise NodeProblem(
            f"This node has {described}; a gpu_p100 node has {GPUS} P100s (compute capability "
            f"{COMPUTE_CAPABILITY}). If the lease is not for gpu_p100, make a new one (notebook 1); if a GPU is "
            f"missing, the node is faulty: {redo}, and tell Chameleon's help desk which node it was."
        )
    driver = gpus[0].driver
    if gpus[0].branch > LAST_PASCAL_BRANCH:
        raise NodeProblem(
            f"NVIDIA driver {driver} is of branch R{gpus[0].branch}, later than R{LAST_PASCAL_BRANCH}, the last "
            f"branch that supports Pascal GPUs such as the P100: install an R{LAST_PASCAL_BRANCH} driver "
            f"(`sudo apt-get install -y nvidia-driver-{LAST_PASCAL_BRANCH}`, then reboot the server), or start the "
            f"server from an image with one."
        )
    if gpus[0].branch < FIRST_BRANCH:
        raise NodeProblem(
            f"NVIDIA driver {driver} predates R{FIRST_BRANCH}: the lab's images run CUDA 12.6 code, which needs "
            f"R{FIRST_BRANCH} or later (up to R{LAST_PASCAL_BRANCH}, the last with Pascal). Start the server from "
            f"{NODE_IMAGE}, which installs R{FIRST_BRANCH}."
        )
    return gpus


# ---- apt, on a node that just booted ----------------------------------------------------------

APT_LOCKS = ("/var/lib/dpkg/lock-frontend", "/var/lib/dpkg/lock", "/var/lib/apt/lists/lock")
APT_WAIT_S = 900  # unattended-upgrades on a fresh node takes a few minutes; longer, and something is wrong
# What starts unattended-upgrades on Ubuntu, and its shutdown helper: stopped and disabled for the lease
# (the node is wiped when it ends), without waiting for them (--no-block: the lock wait does).
APT_UPDATE_UNITS = ("apt-daily.timer", "apt-daily-upgrade.timer", "unattended-upgrades.service")
# The runs those timers started, maybe in the middle of an upgrade: stopped (unattended-upgrade ends at
# its next safe step on SIGTERM).
APT_UPDATE_RUNS = ("apt-daily.service", "apt-daily-upgrade.service")
# Every apt-get on the node waits for dpkg's lock instead of failing at once: Docker's installation
# script runs its own.
APT_LOCK_CONFIG = "/etc/apt/apt.conf.d/90servelab-lock-timeout"


def wait_for_apt_then(
    command: str,
    limit_s: float = APT_WAIT_S,
    locks: tuple[str, ...] = APT_LOCKS,
    sudo: str = "sudo",
    poll_s: float = 5.0,
    first: str = "",
) -> str:
    """A shell command that runs `first`, then waits until no process holds apt's locks (saying which
    process does, every 30 s), at most `limit_s` seconds (bash's SECONDS: since it started), then runs
    `command`; past the limit it fails, saying what to do."""
    files = " ".join(shlex.quote(lock) for lock in locks)
    script = f"""{first}
said=-30
while pids=$({sudo} fuser {files} 2>/dev/null) && [ -n "$pids" ]; do
  holders=$(ps -o comm= -p "$(echo $pids | tr ' ' ',')" | sort -u | paste -sd, -)
  if [ "$SECONDS" -ge {limit_s:.0f} ]; then
    echo "apt is still locked by $holders after $SECONDS s: on a node that just booted this is \\
unattended-upgrades, which should be done by now. See what it does with 'ps -fp $(echo $pids | tr ' ' ',')', \\
or reboot the server, then run this cell again." >&2
    exit 1
  fi
  if [ $((SECONDS - said)) -ge 30 ]; then
    echo "apt is locked by $holders (unattended-upgrades runs on a node that just booted): waiting, $SECONDS s so far"
    said=$SECONDS
  fi
  sleep {poll_s:g}
done
{command}"""
    return f"bash -c {shlex.quote(script)}"


def stop_apt_updates(
    limit_s: float = APT_WAIT_S, sudo: str = "sudo", apt_config: str = APT_LOCK_CONFIG, **wait: Any
) -> str:
    """The command the node runs right after boot, before its first install: unattended-upgrades and
    apt's daily timers stopped and disabled for the lease (they can hold apt's lock for a new kernel and
    the DKMS rebuild of the NVIDIA driver for it), every apt-get told to wait for dpkg's lock, then apt's
    locks waited for (`wait_for_apt_then`), should a run be finishing its step."""
    units, runs = " ".join(APT_UPDATE_UNITS), " ".join(APT_UPDATE_RUNS)
    first = f"""for unit in {units}; do
  {sudo} systemctl disable --now --no-block "$unit" || echo "$unit: not stopped (above); the lock wait covers it"
done
{sudo} systemctl stop --no-block {runs} || echo "the runs of apt's timers: not stopped (above)"
echo 'DPkg::Lock::Timeout "{limit_s:.0f}";' | {sudo} tee {shlex.quote(apt_config)} >/dev/null"""
    done = "echo 'Automatic upgrades are stopped for the lease, and apt is free.'"
    return wait_for_apt_then(done, limit_s, sudo=sudo, first=first, **wait)


def apt_get(arguments: str, limit_s: float = APT_WAIT_S) -> str:
    """`sudo apt-get ARGUMENTS` once apt's locks are free (`wait_for_apt_then`); apt itself also waits
    for dpkg's lock for the same limit, should unattended-upgrades take it again in between."""
    return wait_for_apt_then(f"sudo apt-get -o DPkg::Lock::Timeout={limit_s:.0f} {arguments}", limit_s)


# Docker's installation script (it installs the engine and Compose with apt, itself), once apt's locks are free.
INSTALL_DOCKER = "command -v docker >/dev/null || curl -fsSL https://get.docker.com | sudo sh"


def install_docker(limit_s: float = APT_WAIT_S) -> str:
    return wait_for_apt_then(INSTALL_DOCKER, limit_s)


# ---- the lease: a name of its own, found again by id ------------------------------------------


def lease_name(user: str, start: datetime) -> str:
    """The lease's name, unique to the user and its start (UTC, to the minute): python-chi looks a
    lease up by name, and two leases of one name make that lookup fail, or `submit(idempotent=True)`
    create yet another (it takes an ended lease of that name as absent)."""
    return f"serve_system_{user}_{start:%Y%m%d_%H%M}"


def save_lease(lease: Any, path: Path = LEASE_RECORD) -> None:
    """Keep a python-chi lease's id (and name, end) where notebook 2 reads it; nothing if it has no id
    (it was never created)."""
    if getattr(lease, "id", None):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"id": lease.id, "name": lease.name, "end_date": str(lease.end_date)}, indent=1))


def saved_lease_id(path: Path = LEASE_RECORD) -> str | None:
    return json.loads(path.read_text())["id"] if path.is_file() else None


def lease_id(given: str = "", path: Path = LEASE_RECORD) -> str:
    """The lease to use: `given` (a lease made in Horizon: its ID), else the one notebook 1 made."""
    found = given.strip() or saved_lease_id(path)
    if not found:
        raise NodeProblem(
            "No lease to find: run notebook 1's 'Create the lease' cell in this clone, or, for a lease made in "
            "Horizon (Reservations > Leases > its name), set LEASE_ID in the Settings cell to its ID."
        )
    return found


def reusable_lease(get_lease: Any, path: Path = LEASE_RECORD) -> Any | None:
    """The lease notebook 1 made before (python-chi's `lease.get_lease`, by its id), unless it has
    ended or is gone: then None, and a new one is made."""
    saved = saved_lease_id(path)
    if saved is None:
        return None
    try:
        found = get_lease(saved)
    except ValueError:  # python-chi's CHIValueError: Blazar has no lease of that id any more
        print(f"The lease made before ({saved}) is gone: making a new one.")
        return None
    if found.status in ENDED:
        print(f"The lease made before, {found.name}, is {found.status}: making a new one.")
        return None
    return found


# ---- a private registry for the images --------------------------------------------------------


def registry_of(image_prefix: str) -> str:
    """The registry an image prefix names, as Docker reads a name: its first part where that has a dot or
    a port (or is localhost), else Docker Hub."""
    first, _, rest = image_prefix.partition("/")
    return first if rest and ("." in first or ":" in first or first == "localhost") else "docker.io"


def docker_login(connection: Connection, image_prefix: str, username: str, token: str) -> str:
    """Log the node's Docker in to the registry of `image_prefix` (SERVELAB_IMAGE_PREFIX), so that the
    build's pull of the images may read them; what Docker said. The token goes to `docker login` on its
    standard input, never on a command line or into a file of the clone (Docker keeps it in the node's
    ~/.docker/config.json, wiped with the lease). NodeProblem, saying what to do, where Docker refused."""
    registry = registry_of(image_prefix)
    command = f"docker login --username {shlex.quote(username)} --password-stdin {shlex.quote(registry)}"
    done = connection.run(command, in_stream=io.StringIO(token), hide=True, warn=True)
    if done.exited != 0:
        raise NodeProblem(
            f"docker login to {registry} as {username} failed: {(done.stderr or done.stdout).strip()[:300]}. Check "
            "REGISTRY_USER in the Settings cell and the token (it needs read access to the images), then run "
            "this cell again."
        )
    return (done.stdout or done.stderr).strip()


# ---- the end of part 1: the student's work, off the node --------------------------------------


class Connection(Protocol):
    """What copy_off and docker_login use of fabric's Connection (python-chi's `node.ssh_connection()`)."""

    def run(self, command: str, **kwargs: Any) -> Any: ...

    def get(self, remote: str, local: str) -> Any: ...


WORK = ("notebooks", "results", ".lab/node-build/build.log", ".lab/node-build/state.json")


def copy_off(connection: Connection, repo_dir: str, destination: Path) -> list[str]:
    """Copy the node's notebooks (as the student saved them, with their outputs), the runs every
    notebook kept (results/) and the build's log and measured times into `destination`; the files
    copied. Whatever of WORK is not there yet is left out."""
    archive = f"/tmp/{Path(repo_dir).name}-work.tar.gz"
    paths = " ".join(shlex.quote(path) for path in WORK)
    connection.run(f"cd {shlex.quote(repo_dir)} && tar czf {archive} --ignore-failed-read {paths}", hide=True)
    destination.mkdir(parents=True, exist_ok=True)
    local = destination / "work.tar.gz"
    connection.get(archive, str(local))
    names = extract_inside(local, destination)
    local.unlink()
    return names


def extract_inside(archive: Path, destination: Path) -> list[str]:
    """Unpack a tar archive into `destination`, none of it outside, whatever the archive holds; the names
    of its files. tarfile's own "data" filter does it where this Python has one (3.10.12+, 3.11.4+, 3.12:
    Chameleon's Jupyter server may be older); elsewhere each member is checked first, as that filter
    does: ValueError, and nothing unpacked, for a name or a link that leads outside (absolute, or by
    `..`), or anything but files, folders and links."""
    with tarfile.open(archive) as tar:
        members = tar.getmembers()
        if hasattr(tarfile, "data_filter"):
            tar.extractall(destination, filter="data")
        else:
            tar.extractall(destination, members=[inside(member, destination.resolve()) for member in members])
    return [member.name for member in members if member.isfile()]


def inside(member: tarfile.TarInfo, root: Path) -> tarfile.TarInfo:
    """`member`, if it unpacks inside `root` (its mode without setuid, setgid or others' write); else ValueError."""

    def lands_inside(path: str) -> bool:  # `..` that leads back inside is fine; one that leads out is not
        return not Path(path).is_absolute() and root in (root / path).resolve().parents

    target = (Path(member.name).parent / member.linkname).as_posix() if member.issym() else member.linkname
    if not lands_inside(member.name) or ((member.issym() or member.islnk()) and not lands_inside(target)):
        raise ValueError(f"the archive holds {member.name!r}, which would land outside {root}: nothing was unpacked")
    if not (member.isfile() or member.isdir() or member.issym() or member.islnk()):
        raise ValueError(
            f"the archive holds {member.name!r}, neither a file, a folder nor a link: nothing was unpacked"
        )
    member.mode &= 0o775
    return member
