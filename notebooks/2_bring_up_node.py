# %% [markdown]
# # 2. Bring up the GPU node
#
# **Time:** about 35 minutes (6 reading, 29 running, 0 hands-on; `python -m servelab.time_plan`)
#
# *Chameleon path only. On the local path, skip to `3_fastapi.ipynb`.*
#
# Your *lease* from notebook 1 (Chameleon's booking of hardware for a time window) has started: the
# `gpu_p100` node is yours until it ends. This notebook prepares it:
#
# 1. a *server* (an operating system running on the node) from the `CC-Ubuntu24.04-CUDA` image
#    (Ubuntu with the NVIDIA driver and CUDA), with a public address to reach it;
# 2. this repository, cloned on the node;
# 3. Docker, and the NVIDIA container toolkit, which lets containers use the GPUs;
# 4. `nvtop`, a terminal monitor of GPU use;
# 5. the lab's container images, which also build the model files from the original lab's trained
#    weights;
# 6. the lab's Compose project: every service of notebooks 3 to 10, and the Jupyter they run in.
#
# **Where the cells run:** in Chameleon's Jupyter server, like notebook 1; commands for the node go
# over SSH (python-chi's `execute`), their output below each cell. Elsewhere the cells are skipped.
#
# Check the first cells (project, lease) yourself; then click the code cell under "Start the
# server" and use **Run > Run Selected Cell and All Below**. Keep watching, to see any error when
# it happens.

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
import time
from pathlib import Path

from chi import context, lease, server

# The repository root, so `servelab` imports where the lab is not pip-installed (Chameleon's
# Jupyter server). servelab.environment needs nothing beyond the standard library.
if (Path.cwd().parent / "servelab").is_dir():
    sys.path.insert(0, str(Path.cwd().parent))
from servelab.environment import chameleon_only, current_services
from servelab.settings import repository_url

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
# - `LEASE_NAME`: the name you gave the lease in notebook 1. The server is named after you too.
# - `REPO_URL`: the repository the node clones. By default `SERVELAB_REPO_URL`, else this notebook's
#   `origin` as an `https://` address (the node has no key for SSH). A copy without git (Trovi) stops
#   here, saying where to set it.
# - `REPO_COMMIT`: the commit the node checks out. By default, this notebook's, so that the node
#   runs the lab you are reading; `""` takes the remote's default branch.

# %%
USERNAME = os.getenv("USER", "student")
LEASE_NAME = f"serve_system_{USERNAME}"
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

print(f"Lease: {LEASE_NAME}")
print(f"Server: {NODE_NAME}, image {NODE_IMAGE}")
print(f"Repository: {REPO_URL or '(read on Chameleon)'} -> ~/{REPO_DIR} on the node")
print(f"Commit: {REPO_COMMIT or 'the default branch'}")

# %% [markdown]
# ## Find the lease
#
# The server must start *inside* the lease, so look the lease up by name. Its status must be
# "ACTIVE"; if not, the cell stops and says what to do.

# %%
if chameleon_only("look the lease up and check that it is active"):
    gpu_lease = lease.get_lease(LEASE_NAME)
    gpu_lease.show()
    lease_status = gpu_lease.status  # asks Chameleon again each time it is read
    if lease_status != "ACTIVE":
        raise RuntimeError(
            f"Lease {LEASE_NAME} is {lease_status}, not ACTIVE: wait until it starts, then run this cell again."
        )

# %% [markdown]
# ## Start the server
#
# python-chi asks for a server from the lease's *node reservation* (the part of the lease that
# books the node), with the image, and waits until it runs. A bare-metal server boots like a real
# machine (firmware, network boot, copying the image to disk): notebook 1's plan gives how long.
#
# `idempotent=True` makes the cell safe to run again: a server with this name is reused, *whatever
# its state*. A boot can fail and leave the server in "ERROR"; the cell then stops and says what to
# do: delete the server (`node.delete()` in a new cell, or in Horizon, Chameleon's web interface:
# **Compute** > **Instances**, **Delete Instance**), wait a minute, and run the cell again.

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
# Note the floating IP: you will use it for SSH, the web UI and Jupyter on the node.
#
# ## Clone the repository on the node
#
# From here on, `node.execute(...)` runs a shell command on the node over SSH, as user `cc`, and
# shows its output; a command that fails stops the cell.

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
# Every service of the lab (FastAPI, Triton, GourmetGram, Jupyter) runs in a container, which
# brings its own libraries. Docker's installation script sets up the engine and Compose. Adding
# `cc` to the `docker` group lets it use Docker without `sudo` from its next login: each `execute`
# logs in again, so from the next cell on.

# %%
if chameleon_only("install Docker on the node"):
    node.execute("command -v docker >/dev/null || curl -fsSL https://get.docker.com | sudo sh")
    node.execute("sudo usermod -aG docker cc")
    node.execute("docker --version && docker compose version")

# %% [markdown]
# ## Let containers use the GPUs
#
# The image has the NVIDIA driver, but a container sees the GPUs only through the NVIDIA container
# toolkit. The cell adds NVIDIA's package repository (and its signing key), installs the toolkit,
# and registers its runtime with Docker.
#
# It also switches Docker to the `cgroupfs` cgroup driver: with the default `systemd` driver, a
# running container can lose its GPUs when systemd reloads its configuration, and then fails with
# "Failed to initialize NVML"
# ([NVIDIA/nvidia-container-toolkit#48](https://github.com/NVIDIA/nvidia-container-toolkit/issues/48)).
#
# The last command runs `nvidia-smi` in a throwaway container given every GPU: if the toolkit
# works, it lists the node's P100s.

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
    node.execute("sudo apt-get update -q")
    node.execute("sudo apt-get install -y -q nvidia-container-toolkit")
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
    node.execute("sudo apt-get install -y -q nvtop")

# %% [markdown]
# ## Build the lab's images, and the model files in them
#
# Each service runs in a container built from the repository (`compose.yaml`); nothing is installed
# on the node itself. The `torch` image also builds the model files that every service serves: the
# Food-11 MobileNetV2 in PyTorch (`food11.pth`) and exported to ONNX (`food11.onnx`).
#
# The weights are the original lab's, trained on Food-11. `FOOD11_CHECKPOINT=original`, in the
# `.env` file that Compose reads, makes the build download them from GitHub at a fixed commit and
# check the file's git blob id **before** unpickling it: the file is a pickled model, and
# unpickling runs its code. The build then keeps only the weights (a `state_dict`), checks that
# they are a MobileNetV2 for Food-11's classes, and exports the ONNX graph. `WEIGHTS = ""` serves
# untrained weights instead (the labels then mean nothing; every service says so).
#
# The first build downloads several gigabytes: notebook 1's plan gives how long.

# %%
WEIGHTS = "original"
# The build's whole output goes to build.log on the node; shown here: its last lines if it failed,
# else what it said of the weights (nothing when the model files come from an earlier build).
BUILD = (
    "docker compose build --progress plain > build.log 2>&1 || { tail -n 40 build.log; exit 1; };"
    " grep -E 'servelab[.]stack' build.log || echo 'The model files are those of an earlier build.'"
)

if chameleon_only("build the lab's images on the node, the model files from the original lab's weights"):
    node.execute(f"cd {REPO_DIR} && echo FOOD11_CHECKPOINT={shlex.quote(WEIGHTS)} > .env")
    build_started = time.monotonic()
    node.execute(f"cd {REPO_DIR} && {BUILD}")
    print(f"The images were built in {(time.monotonic() - build_started) / 60:.0f} minutes.")

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
# with the private key of the key pair you added to CHI@TACC (your own path if it is elsewhere),
# and the node's floating IP for `A.B.C.D`: the next cell prints the command with it.

# %%
if chameleon_only("print the SSH command for this node"):
    print(f"ssh -i ~/.ssh/id_rsa_chameleon cc@{FLOATING_IP}")

# %% [markdown]
# ## Start the lab's Compose project and its Jupyter container
#
# Notebooks 3 to 10 run in a Jupyter container *on the node*, next to the services they measure.
# It is part of the lab's Compose project (`compose.yaml`: FastAPI with PyTorch and with ONNX
# Runtime, Triton, Ray Serve, the image host, GourmetGram, Jupyter), which starts from the
# repository root:
#
# ```bash
# # runs on the node, in ~/serve-system
# docker compose up -d --build
# ```
#
# The images are built already, so this is quick. Every port is published on the
# node's 127.0.0.1 only: your browser reaches them through an SSH tunnel. Jupyter's URL carries a
# random token, which the container prints:
#
# ```bash
# docker compose exec jupyter jupyter server list
# ```
#
# The next cell does both over SSH, and prints the tunnel to open and the address for your browser.
# In the Jupyter container, `LAB_SERVICES=compose` makes the notebooks reach the services by their
# Compose names (`fastapi_pt`, `triton`...): you set nothing.

# %%
if chameleon_only("start the lab's Compose project and read the Jupyter token"):
    node.execute(f"cd {REPO_DIR} && docker compose up -d --build")
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
    print(f"Then open in your browser: http://127.0.0.1:8888/lab?token={token.group(1)}")

# %% [markdown]
# ## Next
#
# Open the Jupyter URL printed above, then the repository's `notebooks` folder (inside `work/` if
# you see that first), then **`3_fastapi.ipynb`**. From there on, code cells run in that container
# on the node, and shell commands in your SSH session.
#
# Keep this tab open until the end of the lab: a new cell here can send the node another command
# with `node.execute(...)` (after running the cells that define `node`).
