# %% [markdown]
# # 1. Reserve a GPU node on Chameleon
#
# *Chameleon path only. On the local path, skip to `3_fastapi.ipynb`.*
#
# Chameleon's bare-metal nodes are reserved before they are used: you ask for a node type and a
# time window, and Chameleon's reservation service (Blazar) gives you a **lease**. While the lease
# is active, the node is yours alone. When it ends, the node is wiped and handed to the next user.
#
# For this lab you need one node of type **`gpu_p100`** (two NVIDIA P100 GPUs) at the **CHI@TACC**
# site, for about **3 hours**. Plan to use all of it: read notebooks 2 to 11 before your lease
# starts, so that the hours go to running them. The cell after the next one prints a plan for one
# lease: how long bringing the node up takes, computed from figures it names, and budgets for the
# notebooks after it (your notebooks time their own runs).
#
# If the lease runs short, notebooks 8 to 11 each stand alone: skip to any of them once 3 to 7 are
# done.
#
# There are two ways to make the reservation. Use one of them, not both:
#
# - **in code, with python-chi** (Chameleon's Python library), in the cells below;
# - **in the web interface (Horizon)**, following the steps at the end of this notebook.
#
# **Where the cells run:** in Chameleon's Jupyter server (the "Jupyter" entry of the Chameleon
# site), which already has your credentials. On any other machine the cells that talk to
# Chameleon are skipped and say so.

# %% [markdown]
# ## Set up python-chi
#
# The first cell loads python-chi and decides where the lab's services are. On Chameleon's Jupyter
# server (a JupyterHub, which sets `JUPYTERHUB_API_URL`), it sets `LAB_SERVICES=chameleon`, unless
# you set `LAB_SERVICES` yourself.

# %%
import os
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

from chi import context, hardware, lease

# The repository root (above notebooks/, or notebooks/student/), so `servelab` imports where the lab
# is not pip-installed (Chameleon's Jupyter server). servelab.lessons.node needs only the standard library.
REPO_ROOT = next((folder for folder in Path.cwd().parents if (folder / "servelab").is_dir()), Path.cwd().parent)
sys.path.insert(0, str(REPO_ROOT))
from servelab.lessons.node import chameleon_only, current_services

if os.environ.get("JUPYTERHUB_API_URL"):
    os.environ.setdefault("LAB_SERVICES", "chameleon")
print(f"LAB_SERVICES: {current_services()}")

# %% [markdown]
# The plan of the lease: part 1 (notebooks 0-7) in it; part 2 (notebooks 8-11) runs anywhere,
# later. Each notebook's time is its reading (200 words a minute), its measured run time and an
# allowance for each step you do (`python -m servelab.time_plan`). Bringing the node up
# (notebook 2) is mostly waiting: for the server to boot, and for the lab's images to download and
# build, counted from what each downloads at the original lab's rate (about 15 GB in 20 minutes;
# set `DOWNLOAD_MB_PER_S` to your site's, if you know it) until a build on the node has been timed
# (`notebooks/node_build_times.json`). Triton's image builds while you work through notebooks 3
# and 4.

# %%
from servelab.lessons.node import node_plan, node_setup, time_plan

DOWNLOAD_MB_PER_S = node_plan.PLANNING_DOWNLOAD_MB_PER_S
print(time_plan.lease_table(time_plan.plan(download_mb_per_s=DOWNLOAD_MB_PER_S), DOWNLOAD_MB_PER_S))
print()
print(node_plan.setup_table(DOWNLOAD_MB_PER_S))

# %% [markdown]
# Now choose the project to charge the lease to, and the site. Two drop-down menus appear: check
# that the project is the one for this course, and that the site is CHI@TACC.

# %%
if chameleon_only("choose the Chameleon project and site"):
    # Pin python-chi's API generation, so that these cells keep the behaviour they were written for.
    context.version = "1.0"
    context.choose_project()
    context.choose_site(default="CHI@TACC")

# %% [markdown]
# ## What to reserve
#
# The next cell holds the lease's settings. The lease is named after you and its start, so that
# you (and the course staff) can tell it apart from everyone else's, and from your own earlier
# ones: on Chameleon's Jupyter server, `USER` is your Chameleon user name. If your course asks for
# another name (your university ID, say), change `USERNAME`.
#
# `LEASE_START = None` starts the lease now. To reserve a later window, set it to that time in
# **UTC**, for example `datetime(2030, 1, 31, 14, 0, tzinfo=timezone.utc)` for 14:00 UTC on
# 31 January 2030. The next-but-one cell shows when nodes are free.

# %%
USERNAME = os.getenv("USER", "student")
LEASE_HOURS = 3
LEASE_START = None

start = LEASE_START or datetime.now(timezone.utc)
print(
    f"Lease {node_setup.lease_name(USERNAME, start)!r}: one gpu_p100 node for {LEASE_HOURS} hours, "
    f"starting {'now' if LEASE_START is None else f'{start:%Y-%m-%d %H:%M} UTC'}"
)

# %% [markdown]
# ## When is a P100 node free?
#
# Other people reserve these nodes too. This cell asks Chameleon's hardware catalogue for every
# `gpu_p100` node at the site, and Blazar for the next window of at least `LEASE_HOURS` hours in
# which each one is free. A window that starts now means the node is free right away; "no end"
# means nobody has reserved it after that.

# %%
if chameleon_only("list the gpu_p100 nodes and when each one is next free"):
    p100_nodes = hardware.get_nodes(node_type="gpu_p100")
    print(f"{len(p100_nodes)} gpu_p100 nodes at this site")
    for node in p100_nodes:
        if not node.reservable:
            continue
        free_from, free_until = node.next_free_timeslot(minimum_hours=LEASE_HOURS)
        until = "no end" if free_until is None else f"{free_until:%Y-%m-%d %H:%M} UTC"
        print(f"  {node.name}: free from {free_from:%Y-%m-%d %H:%M} UTC until {until}")

# %% [markdown]
# ## Create the lease
#
# The lease asks for one node (`amount=1`) of type `gpu_p100`. Its end is `LEASE_HOURS` after its
# start. (We give python-chi the end time rather than a duration, because it counts a duration
# from *now*, which would shorten a lease that starts later.)
#
# The cell keeps the new lease's id in this clone (`.lab/chameleon_lease.json`), where notebook 2
# finds it, and is safe to run twice: a lease it made that has not ended is used again, not
# doubled. For a lease that starts now, the cell waits until it is active; a lease that starts
# later stays "PENDING" until then.

# %%
if chameleon_only("create the lease, or use the one this cell made before"):
    gpu_lease = node_setup.reusable_lease(lease.get_lease)
    if gpu_lease is None:
        start = LEASE_START or datetime.now(timezone.utc)
        end = start + timedelta(hours=LEASE_HOURS)
        gpu_lease = lease.Lease(node_setup.lease_name(USERNAME, start), start_date=LEASE_START, end_date=end)
        gpu_lease.add_node_reservation(amount=1, node_type="gpu_p100")
        try:
            gpu_lease.submit(wait_for_active=LEASE_START is None)
        finally:
            node_setup.save_lease(gpu_lease)  # its id, once Chameleon gave it one
    print(f"Lease {gpu_lease.name} (id {gpu_lease.id}): {gpu_lease.status}")

# %% [markdown]
# ## Check on the lease
#
# Run this cell whenever you want to see the lease as Chameleon has it: its status, start and end
# (in UTC), and its node reservation. It works in a fresh kernel too, since it looks the lease up by
# the id the cell above kept.

# %%
if chameleon_only("look the lease up by its id and show it"):
    gpu_lease = lease.get_lease(node_setup.lease_id())
    gpu_lease.show()
    print(f"Status: {gpu_lease.status}")

# %% [markdown]
# ## The other route: reserve in Horizon
#
# If you prefer the web interface (or python-chi gave you an error you cannot solve), make the same
# lease in Horizon instead:
#
# 1. On [chameleoncloud.org](https://chameleoncloud.org), open **Experiment** > **CHI@TACC** and
#    log in. At the top left, check that the project is the one for this course.
# 2. In the menu on the left, open **Reservations** > **Leases**, then click **+ Create Lease**.
# 3. On the **General** tab, name the lease `serve_system_`, your user name and the date. Set a
#    start date and time, or leave them empty to start now, and an end about 3 hours after the
#    start. The form shows which time zone it uses: check it.
# 4. On the **Hosts** tab, tick **Reserve Hosts**, keep the minimum and maximum number of hosts at
#    1, and under **Resource Properties** choose `node_type` and then `gpu_p100`.
# 5. Leave the **Networks** and **Devices** tabs as they are, and click **Create**.
#
# The new lease is listed as "Pending" until it starts, then as "Active". Click its name to check
# the details: the start and end times, and the node Chameleon set aside for you. Copy its **ID**
# into `LEASE_ID` in notebook 2's Settings cell. If the form
# reports that no host is available, pick a later window (the **Host Calendar** under
# Reservations shows when `gpu_p100` nodes are taken).
#
# ## Next
#
# At the start of your lease, open **`2_bring_up_node.ipynb`** (in Chameleon's Jupyter server
# again) to start the node and set it up.
#
# When you have finished the whole lab, give the node back early, so that someone else can use it:
# delete the lease in Horizon (Reservations > Leases, **Delete Lease**), or call `delete()` on the
# lease that `lease.get_lease(node_setup.lease_id())` returns. Deleting the lease deletes the
# server on it, and everything stored there: copy your work off first (notebook 2's last cell).
