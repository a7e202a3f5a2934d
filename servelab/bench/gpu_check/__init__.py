"""`make test-gpu`: the lab's GPU path, checked on any Linux machine with an NVIDIA GPU and Python 3.11+.

    python -m servelab.bench.gpu_check [--device cuda|cpu] [--seconds 10] [--warmup 2] [--concurrency 1 16 64]
                                       [--services fastapi_pt fastapi_onnx triton] [--tritonserver PATH] [--out DIR]
                                       [--triton-model-path DIR...]

1. Without an NVIDIA GPU it stops at once, with exit code 2, saying what nvidia-smi, NVML (nvidia-ml-py)
   and PyTorch each saw. `--device cpu` runs the same steps on the CPU instead (CI, a laptop), and its
   table says that nothing on a GPU was checked.
2. Starts fastapi_pt and fastapi_onnx with INFERENCE_DEVICE=cuda (as servelab.service.start plans
   their processes), the original lab's kind of app (naive/pytorch: servelab.bench.naive_app, one
   process, a reference never judged), and Triton's food_classifier (KIND_GPU) where a tritonserver
   is found (--tritonserver, else the nvidia-pytriton wheel's, else one on PATH), each on a free
   127.0.0.1 port.
3. Judges where each runs, from its own report (`judge_service`, `judge_triton`): fastapi_pt must run on
   the GPU, with its first inference at start-up on it (/health's `device`, `device_fallback`,
   `first_inference_ms`); fastapi_onnx too where this ONNX Runtime has a CUDA provider, and where it
   has none it runs on the CPU, reported as such ("CPU"), neither a pass on the GPU nor a failure;
   Triton's instances must say in its log that they run on the GPU. A service that answers any request
   of its load with an error fails.
4. Loads each at concurrency 1, 16 and 64 (a closed loop of the 32 KB soup photo, in client processes
   of their own, one for every 8 senders and at most a quarter of the cores: servelab.loadgen.processes),
   a warm-up then a window each, sampling the GPU's use, each client's CPU, and how the load's
   connections spread over the service's processes (each one's own sockets, the most seen while it
   ran). A service that answers no request of a point is not loaded at the others.
5. Reads each service's GPU memory (its processes, as nvidia-smi lists them) while all of them are up,
   then stops them and measures the in-process ceiling (servelab.measure.ceilings) of PyTorch on the
   GPU, and of ONNX Runtime on the GPU where it has a CUDA provider (else on the CPU, where its service
   runs): one request in flight, the best pipeline in one process, and in as many processes as the
   services plan (the machine's ceiling).
6. Prints one table (the machine first) and writes it to results/gpu-check-<time>.md, with every run in
   results/gpu-check-<time>.json, and the speed goals, met or not: each FastAPI service at least 0.8x
   the machine's ceiling at c=64 (c=16 reported beside it, never judged: workers that share one
   listening socket balance connections, not requests; nor is a point whose client was saturated),
   and never slower than naive/pytorch at the highest concurrency. Speed is reported, never failing
   the check.
Every process it started is stopped at the end, on Ctrl-C and on a failure too. About 4-6 minutes with
the defaults. Exit code 0: every verdict passed (or is the "CPU" case above); 1: one failed; 2: it
cannot run here (no GPU, a model file or a package missing: the message says which).

On a bare GPU machine (Python 3.12 with torch, ONNX Runtime, numpy 2, Pillow, httpx, aiohttp, psutil,
requests, prometheus-client, grpcio, pyyaml, but none of the lab's virtualenv and no internet) it runs
with what travels with the working tree: docs/gpu-check.md says what to bring (the wheels of
scripts/gpu_check_wheels.sh, the model files) and how to run it there (scripts/gpu_check_there.sh).

Its modules, each importing only those listed after it:
- `notebook6`: notebook 6's claims measured on the GPU (`make test-gpu-notebook6`) with the check's
  parts and the lesson's own checks: a batch of 16 images against 1, and 1, 2 and 4 Triton instances;
- `check`: the check itself (the steps above) and its command line, `main`, which `__main__` runs;
  it starts the services as servelab.stack.catalogue describes them, through servelab.stack.supervision,
  and loads them with servelab.loadgen.processes;
- `report`: each service as checked, each runtime's ceiling (servelab.measure.ceilings' sweeps on the
  device checked), the table printed and written (servelab.report.tables), and every run's table;
- `verdicts`: where a service runs, judged from its own report (its /health, Triton's log), and its
  load's failures;
- `triton_alone`: Triton serving food_classifier alone, from the tritonserver found here;
- `machine`: is there a GPU (what nvidia-smi, NVML and PyTorch see), GPU memory by process, the
  machine's line.
"""
