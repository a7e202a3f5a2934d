# %% [markdown]
# # 2. Bring up the GPU node
#
# *Chameleon path only. On the local path, skip to `3_fastapi.ipynb`.*
#
# Your *lease* from notebook 1 (Chameleon's booking of hardware for a time window) has started: the
# `gpu_p100` node is yours until it ends. This notebook prepares it:
#
# 1. a *server* (an operating system on the node) from the `CC-Ubuntu24.04-CUDA` image (Ubuntu
#    with the NVIDIA driver), with a public address, and a check of its GPUs;
# 2. this repository, cloned on the node;
# 3. Docker, the NVIDIA container toolkit (containers use the GPUs through it), and `nvtop`;
# 4. the lab's images and Compose project: what notebooks 3 and 4 use first; Triton's image, the
#    largest, builds while you work through those.
#
# **Where the cells run:** in Chameleon's Jupyter server, like notebook 1; commands for the node go
# over SSH (python-chi's `execute`), their output below each cell. Elsewhere the cells are skipped.
#
# Check the first cells (project, lease) yourself; then click the code cell under "Start the
# server" and use **Run > Run Selected Cell and All Below**. Keep watching: a cell that fails says
# what to do, and every cell can run again.

# %% [markdown]
# ## Set up python-chi
#
# As in notebook 1: load python-chi (Chameleon's Python library), set where the lab's services are,
# and choose your lease's project and site.

# %%
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from chi import context, lease, server

# The repository root (above notebooks/, or notebooks/student/), so `servelab` imports where the lab
# is not pip-installed (Chameleon's Jupyter server). servelab.lessons.node needs only the standard library.
REPO_ROOT = next((folder for folder in Path.cwd().parents if (folder / "servelab").is_dir()), Path.cwd().parent)
sys.path.insert(0, str(REPO_ROOT))
from servelab.lessons.node import chameleon_only, current_services, node_build, node_env, node_setup, repository_url

if os.environ.get("JUPYTERHUB_API_URL"):
    os.environ.setdefault("LAB_SERVICES", "chameleon")
print(f"LAB_SERVICES: {current_services()}")

# %%
if chameleon_only("choose the Chameleon project and site"):
    # Pin python-chi's API generation, so that these cells keep the behaviour they were written for.
    context.version = "1.0"
    context.choose_project()
    context.choose_site(default="CHI@TACC")

# %% [markdown]
# ## Settings
#
# - `LEASE_ID`: empty for the lease notebook 1 made (it kept its id in this clone); for a lease
#   made in Horizon, its ID, from its page there.
# - `REPO_URL`: the repository the node clones. By default `SERVELAB_REPO_URL`, else this notebook's
#   `origin` as an `https://` address (the node has no key for SSH). A copy without git (Trovi) stops
#   here, saying where to set it.
# - `REPO_COMMIT`: the commit the node checks out. By default, this notebook's; `""` takes the
#   remote's default branch.
# - `IMAGE_PREFIX`: empty, and the node builds the lab's images; where your course has pushed them
#   to a registry, its prefix (`docker/compose.registry.yaml`), and the node pulls them.
# - `REGISTRY_USER`: for a private registry, your user there; the build cell asks for its token.

# %%
USERNAME = os.getenv("USER", "student")
LEASE_ID = ""
IMAGE_PREFIX = ""
REGISTRY_USER = ""
NODE_NAME = f"node-serve-system-{USERNAME}"
NODE_IMAGE = "CC-Ubuntu24.04-CUDA"
REPO_DIR = "serve-system"  # the clone's folder on the node, in the home directory of user cc

REPO_URL = ""  # a fork's https:// address; empty: SERVELAB_REPO_URL, else this clone's origin
if not REPO_URL and chameleon_only("find the repository the node clones"):
    REPO_URL = repository_url()

REPO_COMMIT = ""
if not REPO_COMMIT:
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True)
    REPO_COMMIT = head.stdout.strip()
    edited = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True)
    if edited.stdout.strip():
        print("Note: this folder has uncommitted edits; the node gets the commit, without them.")

print(f"Lease: {LEASE_ID or 'the one notebook 1 made'}")
print(f"Server: {NODE_NAME}, image {NODE_IMAGE}")
print(f"Repository: {REPO_URL or '(read on Chameleon)'} -> ~/{REPO_DIR} on the node")
print(f"Commit: {REPO_COMMIT or 'the default branch'}")

# %% [markdown]
# ## Find the lease
#
# The server must start *inside* the lease, so look the lease up by its id. Its status must be
# "ACTIVE"; if not, the cell stops and says what to do.

# %%
if chameleon_only("look the lease up by its id and check that it is active"):
    gpu_lease = lease.get_lease(node_setup.lease_id(LEASE_ID))
    gpu_lease.show()
    lease_status = gpu_lease.status  # asks Chameleon again each time it is read
    if lease_status != "ACTIVE":
        raise RuntimeError(
            f"Lease {gpu_lease.name} is {lease_status}, not ACTIVE: wait until it starts, then run this cell again."
        )

# %% [markdown]
# ## Start the server
#
# python-chi asks for a server from the lease's *node reservation* (the part of the lease that
# books the node), and waits until it runs. A bare-metal server boots like a real machine: notebook
# 1's plan gives how long. `idempotent=True` reuses a server with this name, *whatever its state*;
# a boot that failed leaves it in "ERROR", and the cell says what to do.

# %%
if chameleon_only("start a server on the reserved node"):
    node = server.Server(NODE_NAME, reservation_id=gpu_lease.node_reservations[0]["id"], image_name=NODE_IMAGE)
    node.submit(idempotent=True)
    node.refresh()
    if node.status != "ACTIVE":
        raise RuntimeError(
            f"Server {NODE_NAME} is {node.status}, not ACTIVE: it did not boot. Delete it (node.delete() in a "
            "new cell, or Horizon: Compute > Instances > Delete Instance), wait a minute, then run this cell again."
        )

# %% [markdown]
# ## Give it a public address
#
# The server is on Chameleon's shared network, unreachable from outside. A *floating IP* is a
# public address that Chameleon routes to it (bare-metal sites have no firewall rules to add). The
# cell attaches one unless the server has one, then waits until the server answers on SSH.

# %%
if chameleon_only("attach a floating IP and wait for SSH"):
    node.refresh()
    if node.get_floating_ip() is None:
        node.associate_floating_ip()
    node.check_connectivity()
    FLOATING_IP = node.get_floating_ip()
    node.show(type="widget")
    print(f"Floating IP: {FLOATING_IP}")

# %% [markdown]
# Note the floating IP: SSH, the web UI and Jupyter on the node use it.
#
# ## Check the GPUs
#
# `nvidia-smi` must list the node's two P100s, under a driver whose branch still runs them: R580 is
# the last NVIDIA branch that supports Pascal GPUs, and the lab's images need R560 or later. The
# cell stops at once, saying what to do, when that is not so.

# %%
if chameleon_only("check the node's GPUs and driver"):
    gpus = node_setup.check_gpus(node.execute(node_setup.NVIDIA_SMI).stdout)
    print(f"{len(gpus)} GPUs, driver {gpus[0].driver}: ready.")

# %% [markdown]
# ## Stop automatic upgrades
#
# From here on, `node.execute(...)` runs a shell command on the node over SSH, as user `cc`, and
# shows its output; a command that fails stops the cell.
#
# A freshly booted node runs `unattended-upgrades`, which can hold apt's lock for many minutes (a
# new kernel, and the NVIDIA driver rebuilt for it). The cell stops it for the lease, then waits
# until apt is free.

# %%
if chameleon_only("stop automatic upgrades on the node"):
    node.execute(node_setup.stop_apt_updates())

# %% [markdown]
# ## Clone the repository on the node

# %%
if chameleon_only("clone the repository on the node"):
    node.execute(f"test -d {REPO_DIR} || git clone {shlex.quote(REPO_URL)} {REPO_DIR}")
    if REPO_COMMIT:
        missing = (
            f"commit {REPO_COMMIT} is not on {REPO_URL}: push it there, or set REPO_COMMIT in the Settings cell "
            "to a commit the remote has ('' for its default branch)"
        )
        node.execute(
            f"git -C {REPO_DIR} fetch --quiet origin {shlex.quote(REPO_COMMIT)} && "
            f"git -C {REPO_DIR} checkout --quiet --detach {shlex.quote(REPO_COMMIT)} "
            f"|| {{ echo {shlex.quote(missing)} >&2; exit 1; }}"
        )
    node.execute(f"git -C {REPO_DIR} log -1 --format='Checked out commit %h: %s'")

# %% [markdown]
# ## Install Docker
#
# Every service of the lab runs in a container, which brings its own libraries. Docker's
# installation script sets up the engine and Compose. Adding `cc` to the `docker` group lets it
# use Docker without `sudo` from its next login (each `execute` logs in again).
#
# Installs still wait for apt's lock (at most 15 minutes), saying who holds it.

# %%
if chameleon_only("install Docker on the node"):
    node.execute(node_setup.install_docker())
    node.execute("sudo usermod -aG docker cc")
    node.execute("docker --version && docker compose version")

# %% [markdown]
# ## Let containers use the GPUs
#
# A container sees the GPUs only through the NVIDIA container toolkit. The cell adds NVIDIA's
# package repository, installs the toolkit, registers it with Docker, and switches Docker to the
# `cgroupfs` cgroup driver: with `systemd`'s, a container can lose its GPUs when systemd reloads
# ("Failed to initialize NVML",
# [NVIDIA/nvidia-container-toolkit#48](https://github.com/NVIDIA/nvidia-container-toolkit/issues/48)).
# Last, `nvidia-smi` in a throwaway container lists the P100s.

# %%
NVIDIA_APT_SOURCE = (
    "curl -fsSL https://nvidia.github.io/libnvidia-container/gpgkey"
    " | sudo gpg --batch --yes --dearmor -o /usr/share/keyrings/nvidia-container-toolkit-keyring.gpg"
    " && curl -fsSL https://nvidia.github.io/libnvidia-container/stable/deb/nvidia-container-toolkit.list"
    " | sed 's#deb https://#deb [signed-by=/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg] https://#g'"
    " | sudo tee /etc/apt/sources.list.d/nvidia-container-toolkit.list"
)
# Adds the cgroup driver setting to the Docker configuration that nvidia-ctk just wrote.
USE_CGROUPFS = (
    "import json, pathlib\n"
    "path = pathlib.Path('/etc/docker/daemon.json')\n"
    "config = json.loads(path.read_text()) if path.exists() else {}\n"
    "config['exec-opts'] = ['native.cgroupdriver=cgroupfs']\n"
    "path.write_text(json.dumps(config, indent=2))\n"
)

if chameleon_only("install the NVIDIA container toolkit on the node"):
    node.execute(NVIDIA_APT_SOURCE)
    node.execute(node_setup.apt_get("update -q"))
    node.execute(node_setup.apt_get("install -y -q nvidia-container-toolkit"))
    node.execute("sudo nvidia-ctk runtime configure --runtime=docker")
    node.execute(f"sudo python3 -c {shlex.quote(USE_CGROUPFS)}")
    node.execute("sudo systemctl restart docker")
    node.execute("docker run --rm --gpus all ubuntu:24.04 nvidia-smi")

# %% [markdown]
# ## Install nvtop
#
# `nvtop` shows, live, each GPU's use and memory: run it in an SSH session to watch a benchmark
# (the notebooks also record GPU use themselves).

# %%
if chameleon_only("install nvtop on the node"):
    node.execute(node_setup.apt_get("install -y -q nvtop"))

# %% [markdown]
# ## Build the lab's images, and the model files in them
#
# The `torch` image also builds the model files every service serves (the Food-11 MobileNetV2, in
# PyTorch and ONNX) from the original lab's weights: `FOOD11_CHECKPOINT=original`, in the `.env`
# file Compose reads, downloads them at a fixed commit and checks their git blob id **before**
# unpickling them (unpickling runs the file's code). `WEIGHTS = ""` serves untrained weights.
#
# The build downloads about 25 GB. It runs on the node detached from this notebook: a dropped
# connection does not stop it, and running the cell again shows it, or resumes it where it
# stopped. Its stages, each built then started: what notebooks 3 and 4 use (the cell waits for it,
# showing the image, the time so far and the log's last line); Triton, while you work through
# notebooks 3 and 4 (notebooks 5 to 7 wait for it); Ray Serve. On the node,
# `python3 -m servelab.node_build status` says where it is.

# %%
WEIGHTS = "original"

if IMAGE_PREFIX and REGISTRY_USER and chameleon_only("log the node's Docker in to the images' registry"):
    from getpass import getpass

    registry = node_setup.registry_of(IMAGE_PREFIX)
    token = os.environ.get("SERVELAB_REGISTRY_TOKEN") or getpass(f"Token of {REGISTRY_USER} at {registry}: ")
    with node.ssh_connection() as ssh:
        print(node_setup.docker_login(ssh, IMAGE_PREFIX, REGISTRY_USER, token))

if chameleon_only("build the lab's images on the node, in the background, and start what notebooks 3 and 4 use"):
    # .env: the weights, and COMPOSE_FILE=compose.yaml:docker/compose.gpu.yaml, the node's GPU variant
    node.execute(f"cd {REPO_DIR} && printf %s {shlex.quote(node_env.env_file(WEIGHTS, IMAGE_PREFIX))} > .env")
    with node.ssh_connection() as ssh:
        node_build.follow(lambda command: ssh.run(command, hide=True).stdout, REPO_DIR, until="fastapi")

# %% [markdown]
# ## Open an SSH session
#
# Some steps of the lab are shell commands on the node (starting containers, watching `nvtop`).
# Run them from a terminal on your own computer:
#
# ```bash
# ssh -i ~/.ssh/id_rsa_chameleon cc@A.B.C.D
# ```
#
# with your CHI@TACC key pair's private key, and the node's floating IP for `A.B.C.D`: the next
# cell prints the command.

# %%
if chameleon_only("print the SSH command for this node"):
    print(f"ssh -i ~/.ssh/id_rsa_chameleon cc@{FLOATING_IP}")

# %% [markdown]
# ## Open the Jupyter container
#
# Notebooks 3 to 11 run in a Jupyter container *on the node*, next to the services they measure,
# in the Compose project (`compose.yaml`) the build started. It opens your copies of the notebooks,
# answers cleared. Ports are published on the node's 127.0.0.1 only: your browser reaches them
# through an SSH tunnel. The next cell reads Jupyter's token and prints the tunnel and the address
# to open. There, `LAB_SERVICES=compose` makes the notebooks reach the services by their Compose
# names: you set nothing.

# %%
if chameleon_only("read the Jupyter token"):
    # Jupyter writes its URL a few seconds after its container starts: ask until it is there.
    servers = node.execute(
        f"cd {REPO_DIR} && for attempt in $(seq 30); do"
        " docker compose exec -T jupyter jupyter server list 2>/dev/null | grep -q 'token=' && break; sleep 2; done;"
        " docker compose exec -T jupyter jupyter server list"
    )
    token = re.search(r"token=(\w+)", servers.stdout)
    if token is None:
        raise RuntimeError("The Jupyter container printed no token: check `docker compose logs jupyter` on the node.")
    print(f"On your own machine, open the tunnel: ssh -i ~/.ssh/id_rsa_chameleon -N -L 8888:127.0.0.1:8888 "
          f"-L 8300:127.0.0.1:8300 -L 8100:127.0.0.1:8100 -L 8101:127.0.0.1:8101 cc@{FLOATING_IP}")
    print(f"Then open in your browser: http://127.0.0.1:8888/lab/tree/3_fastapi.ipynb?token={token.group(1)}")

# %% [markdown]
# ## Next
#
# Open the Jupyter URL printed above: it opens **`3_fastapi.ipynb`**. From there on, code cells run
# in that container on the node, and shell commands in your SSH session.
#
# Keep this tab open until the end of the lab: a new cell here can send the node commands
# (`node.execute(...)`).
#
# ## Before the lease ends: copy your work off the node
#
# When the lease ends, the node is wiped. At the end of part 1 (notebook 7), run this cell: it
# copies your saved notebooks, with their outputs, and every run they kept (`results/`) into
# `from_node/` in this clone, on Chameleon's Jupyter server. In a fresh kernel, run the cells up to
# "Give it a public address" first.

# %%
if chameleon_only("copy the notebooks and results off the node"):
    with node.ssh_connection() as ssh:
        copied = node_setup.copy_off(ssh, REPO_DIR, REPO_ROOT / "from_node" / gpu_lease.name)
    print(f"{len(copied)} files copied to from_node/{gpu_lease.name}:", *sorted(copied), sep="\n  ")
