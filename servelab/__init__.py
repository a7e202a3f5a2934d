"""Tooling for the serve-system lab, in layers: a folder imports only the folders below it.

    lab/       what notebooks call: Lab.connect(), its Triton and Ray Serve sides, GourmetGram's
               client, running a notebook and checking its verdicts
    bench/     the headline benchmark: its targets, the run, its report, the naive reference app;
               the GPU check, and notebook 6's claims judged on a GPU by the lesson's checks
    lessons/   a folder per notebook: its checks, the loads it runs, its tables; and the
               expectation/verdict records the checks return
    report/    figures and Markdown tables drawn from run records
    loadgen/   the load generator (closed and open loop, sequences, streams)
    measure/   CPU/GPU sampling, timelines, a service's own metrics, queueing models, the
               in-process ceiling
    ray/       Ray Serve on this machine: the launcher, its REST API, two nodes, watching replicas
    stack/     the local services as supervised processes; building the model files
    triton/    Triton: the local server, model configs and registry, statistics, perf_analyzer,
               the Triton container's start, the Python-backend models' set-up and ONNX Runtime model
    service/   what runs inside a service (every Docker image installs it; imports nothing above)

At the bottom, modules every folder may use: settings (every environment variable the tooling reads,
read once), paths (where files live), environment (where the lab's services are: local or the
Compose project's), results (the run record), profiles (quick/full), retries, polling (reading a
server's counts until they settle), progress (bars where someone watches), jsonl and service_exits;
and, standard library only like environment, for Chameleon's own Jupyter server and the node:
node_setup (the node's checks, apt, the lease, copying the work off), node_env (Compose's .env there),
node_build (the node's images, built detached in stages) and node_traffic (a quiet step told from a
stopped one by the bytes the node receives), node_plan and time_plan (notebook 2's set-up, and each
notebook's time: notebook 1's plan of the lease).
tests/test_layout.py keeps the arrows pointing down.
"""
