"""What the notebooks use: one lab, two targets.

    from servelab.lab import Lab
    lab = Lab.connect()

LAB_TARGET chooses the target:
- `local` (the default): the embedded stack on 127.0.0.1, CPU only. A stack already started with
  `make up` is used; otherwise the notebook starts one and stops it when its kernel exits.
- `chameleon`: the Docker Compose services on the GPU node, reached by their service names from
  the Jupyter container.

LAB_PROFILE chooses how long each measurement runs: `full` (the default) or `quick` (CI; every
experiment still runs, with short windows).

A Triton config change is shown as the exact text change to `config.pbtxt`, written by code (so
a notebook runs unattended and the student still sees the edit), and applied by reloading that
one model through Triton's model-control API (the server runs with explicit model control, on
both targets). Locally the edited config is adapted to the CPU first, and that adaptation is
printed too.
"""

from __future__ import annotations

import atexit
import base64
import difflib
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import requests
import tritonclient.http as triton_http

from servelab import loadgen, paths, perf_analyzer, plots, triton_local
from servelab.environment import chameleon_only, current_target  # noqa: F401 (notebooks import them from here too)
from servelab.results import RunResult
from servelab.stack import LocalStack, Ports, fastapi_service, gourmetgram_service, triton_service

log = logging.getLogger(__name__)

SAMPLE_IMAGE = paths.GOURMETGRAM_DIR / "static" / "samples" / "soup.jpg"
NOTEBOOK_STACK_DIR = paths.LAB_DIR / "notebook-stack"


@dataclass(frozen=True)
class Profile:
    duration_s: float  # measured seconds of one load-generator run
    warmup_s: float
    sequential_requests: int  # requests in a one-at-a-time latency measurement
    perf_window_ms: int  # perf_analyzer measurement window


PROFILES = {
    "full": Profile(duration_s=20.0, warmup_s=3.0, sequential_requests=100, perf_window_ms=5000),
    "quick": Profile(duration_s=2.0, warmup_s=0.5, sequential_requests=20, perf_window_ms=1500),
}


@dataclass
class Prediction:
    claim: str
    held: bool
    evidence: str
    reason: str = ""

    def __str__(self) -> str:
        verdict = "HELD" if self.held else "DID NOT HOLD"
        text = f"Prediction: {self.claim}\n  -> {verdict} on this machine: {self.evidence}"
        return text + (f"\n  Why: {self.reason}" if self.reason and not self.held else "")


@dataclass
class Lab:
    target: str
    profile_name: str
    fastapi_urls: dict[str, str]  # flavor ("pt"/"onnx") -> http://host:port
    triton_http: str  # host:port
    triton_grpc: str
    repository: Path  # the model repository the running Triton loads
    gourmetgram_url: str | None = None
    has_gpu: bool = False
    results: list[RunResult] = field(default_factory=list)
    predictions: list[Prediction] = field(default_factory=list)
    _stacks: list[LocalStack] = field(default_factory=list, repr=False)

    # ---- connecting ------------------------------------------------------------------------

    @classmethod
    def connect(cls, triton: bool = True) -> "Lab":
        """Connect to the target's services; locally, `triton=False` starts FastAPI only (faster)."""
        logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
        target = current_target()
        profile = os.environ.get("LAB_PROFILE", "full")
        if profile not in PROFILES:
            raise ValueError(f"LAB_PROFILE={profile!r}: use one of {sorted(PROFILES)}")
        lab = cls._chameleon(profile) if target == "chameleon" else cls._local(profile, triton)
        print(lab.describe())
        return lab

    @classmethod
    def _chameleon(cls, profile: str) -> "Lab":
        triton = os.environ.get("TRITON_SERVER_URL", "triton_server:8000")
        fastapi = os.environ.get("FASTAPI_SERVER_URL", "http://fastapi_server:8000")
        return cls(
            target="chameleon",
            profile_name=profile,
            fastapi_urls={_fastapi_flavor(fastapi): fastapi} if _answers(f"{fastapi}/health") else {},
            triton_http=triton,
            triton_grpc=triton.rsplit(":", 1)[0] + ":8001",
            repository=paths.MODELS_STAGING_DIR,  # mounted into the Triton container as /models
            gourmetgram_url=os.environ.get("GOURMETGRAM_URL", "http://flask:5000"),
            has_gpu=True,
        )

    @classmethod
    def _local(cls, profile: str, triton: bool) -> "Lab":
        default = Ports.from_env()
        if _answers(f"http://127.0.0.1:{default.triton_http}/v2/health/ready") and _answers(
            f"http://127.0.0.1:{default.fastapi_pt}/health"
        ):
            ports, repository, stacks = default, paths.TRITON_DIR / "models", []
            print("Using the lab already running on this machine (`make up`).")
        else:
            ports = Ports.free()
            work = NOTEBOOK_STACK_DIR / str(os.getpid())
            services = [fastapi_service("pt", ports.fastapi_pt), fastapi_service("onnx", ports.fastapi_onnx)]
            if triton:
                services.append(triton_service(ports.triton, work_dir=work / "triton"))
            stack = LocalStack(services, log_dir=work / "logs")
            print(f"Starting the local serving stack for this notebook ({', '.join(s.name for s in services)})...")
            stack.start()
            atexit.register(_stop_and_clean, stack, work)
            repository, stacks = work / "triton" / "models", [stack]
        return cls(
            target="local",
            profile_name=profile,
            fastapi_urls={"pt": f"http://127.0.0.1:{ports.fastapi_pt}", "onnx": f"http://127.0.0.1:{ports.fastapi_onnx}"},
            triton_http=f"127.0.0.1:{ports.triton_http}",
            triton_grpc=f"127.0.0.1:{ports.triton_grpc}",
            repository=repository,
            _stacks=stacks,
        )

    @property
    def on_chameleon(self) -> bool:
        return self.target == "chameleon"

    @property
    def profile(self) -> Profile:
        return PROFILES[self.profile_name]

    def describe(self) -> str:
        where = "Chameleon GPU node (Docker Compose services)" if self.on_chameleon else "this machine, CPU only (local stack)"
        lines = [
            f"Target: {self.target} -- {where}; profile: {self.profile_name}",
            *(f"  FastAPI ({flavor}): {url}" for flavor, url in self.fastapi_urls.items()),
            f"  Triton: HTTP {self.triton_http}, gRPC {self.triton_grpc}",
        ]
        return "\n".join(lines)

    def stop(self) -> None:
        """Stop what this notebook started (nothing, when it uses `make up` or Docker)."""
        for stack in self._stacks:
            stack.stop()
        self._stacks.clear()

    # ---- requests and measurements ---------------------------------------------------------

    @staticmethod
    def sample_image() -> bytes:
        return SAMPLE_IMAGE.read_bytes()

    def fastapi_url(self, flavor: str) -> str:
        if flavor not in self.fastapi_urls and self.on_chameleon:
            # The student may have switched the server since connecting: ask it what it runs now.
            url = os.environ.get("FASTAPI_SERVER_URL", "http://fastapi_server:8000")
            if _answers(f"{url}/health"):
                self.fastapi_urls = {_fastapi_flavor(url): url}
        if flavor not in self.fastapi_urls:
            raise RuntimeError(
                f"The FastAPI server runs {', '.join(self.fastapi_urls) or 'nothing reachable'}, not {flavor}. "
                f"Switch it on the node with FASTAPI_SERVICE=fastapi_{flavor} docker compose "
                "-f docker/docker-compose-fastapi.yaml up -d --build fastapi_server"
            )
        return self.fastapi_urls[flavor]

    def predict(self, flavor: str, image: bytes | None = None) -> dict:
        """One real request to FastAPI's /predict, as the Swagger page would send it."""
        payload = {"image": base64.b64encode(image or self.sample_image()).decode()}
        response = requests.post(f"{self.fastapi_url(flavor)}/predict", json=payload, timeout=60)
        response.raise_for_status()
        return response.json()

    def sequential(self, flavor: str) -> RunResult:
        """One request at a time, as many as the profile says: the latency without queueing."""
        result = loadgen.closed_loop(
            "fastapi", self.fastapi_url(flavor), concurrency=1, requests=self.profile.sequential_requests,
            warmup_requests=3, image_bytes=self.sample_image(), progress=False,
        )
        return self._keep(result, f"fastapi_{flavor}")

    def concurrent(self, flavor: str, concurrency: int) -> RunResult:
        result = loadgen.closed_loop(
            "fastapi", self.fastapi_url(flavor), concurrency=concurrency, duration_s=self.profile.duration_s,
            warmup_s=self.profile.warmup_s, image_bytes=self.sample_image(), progress=False,
        )
        return self._keep(result, f"fastapi_{flavor}")

    def perf(self, model: str, concurrency: int | None = 1, batch_size: int = 1, rate: float | None = None,
             distribution: str = "constant") -> RunResult:
        """perf_analyzer against Triton, with this profile's measurement windows."""
        kwargs = {}
        if model == "food_classifier":
            kwargs["input_data"] = self.image_input_data()
        else:
            kwargs["shape"] = ["input:3,224,224"]
        result = perf_analyzer.run(
            self.triton_http, model, concurrency=None if rate else concurrency, request_rate=rate,
            request_distribution=distribution, batch_size=batch_size,
            measurement_interval_ms=self.profile.perf_window_ms, stability_percentage=50, max_trials=5,
            timeout_s=600, **kwargs,
        ).results[0]
        return self._keep(result, result.target)

    def image_input_data(self) -> Path:
        """perf_analyzer's --input-data file for food_classifier: the sample image, base64-encoded."""
        path = paths.LAB_DIR / "perf_input_food_classifier.json"
        encoded = base64.b64encode(self.sample_image()).decode()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"data": [{"INPUT_IMAGE": {"content": [encoded], "shape": [1]}}]}))
        return path

    def _keep(self, result: RunResult, target: str) -> RunResult:
        result.target = target
        self.results.append(result)
        print(summary_line(result))
        return result

    def scale_rates(self, rates: list[float], model: str = "food_classifier_onnx") -> list[float]:
        """The request rates to use here for an experiment written for two P100 GPUs.

        On Chameleon they are used as written. Locally, the capacity of one `model` instance is
        measured, and the rates are scaled so that the highest one is 90% of it: the experiment
        keeps its shape (light load to near saturation) on a machine many times slower.
        """
        if self.on_chameleon:
            return list(rates)
        capacity = perf_analyzer.run(
            self.triton_http, model, concurrency=4, shape=["input:3,224,224"],
            measurement_interval_ms=self.profile.perf_window_ms, stability_percentage=50, max_trials=5,
        ).results[0].throughput_rps
        factor = 0.9 * capacity / max(rates)
        scaled = [round(rate * factor, 1) for rate in rates]
        print(f"This machine serves about {capacity:.1f} req/s with one {model} instance (measured just now). "
              f"The lab's rates {rates} req/s were chosen for a P100 GPU; here they are scaled by "
              f"{factor:.3f} to {scaled} req/s, so the highest is 90% of this machine's capacity.")
        return scaled

    def check(self, claim: str, held: bool, evidence: str, reason: str = "") -> Prediction:
        """State a predicted trend, and whether this run's numbers bore it out."""
        prediction = Prediction(claim, bool(held), evidence, reason)
        self.predictions.append(prediction)
        print(prediction)
        return prediction

    def table(self, results: list[RunResult] | None = None) -> str:
        table = plots.results_table(results if results is not None else self.results)
        print(table)
        return table

    # ---- the web UI -----------------------------------------------------------------------

    def ui(self, backend: str) -> str:
        """GourmetGram's URL for a backend: started here locally; the `flask` container on Chameleon."""
        if self.on_chameleon:
            return self.gourmetgram_url
        port = Ports.free().gourmetgram
        ports = Ports(
            fastapi_pt=int(self.fastapi_urls["pt"].rsplit(":", 1)[1]),
            fastapi_onnx=int(self.fastapi_urls["onnx"].rsplit(":", 1)[1]),
            triton_http=int(self.triton_http.rsplit(":", 1)[1]),
        )
        stack = LocalStack([gourmetgram_service(port, backend, ports)], log_dir=NOTEBOOK_STACK_DIR / "ui-logs").start()
        self._stacks.append(stack)
        atexit.register(stack.stop)
        return f"http://127.0.0.1:{port}"

    # ---- Triton model configs ----------------------------------------------------------------

    def config_text(self, model: str) -> str:
        """The config as shipped for the GPU node (the text a student edits).

        Read from git, not from the file: on Chameleon the server loads models_staging/ itself,
        so after an edit the file no longer holds the shipped text, and a restore must.
        """
        relative = f"models_staging/{model}/config.pbtxt"
        shipped = subprocess.run(["git", "show", f"HEAD:{relative}"], cwd=paths.REPO_ROOT, capture_output=True, text=True)
        return shipped.stdout if shipped.returncode == 0 else (paths.REPO_ROOT / relative).read_text()

    def apply_config(self, model: str, edited: str) -> None:
        """Show the edit as a diff, write it where the server reads it, and reload that one model."""
        shipped = self.config_text(model)
        print(_diff(shipped, edited, f"{model}/config.pbtxt (as shipped)", f"{model}/config.pbtxt (edited)") or
              f"{model}/config.pbtxt: back to the config as shipped")
        served = edited
        if not self.on_chameleon:
            weights = json.loads(Path(str(paths.MODELS_STAGING_DIR / model / "1" / _model_file(model)) + ".weights.json").read_text())
            served = triton_local.adapt_config_for_cpu(edited, weights)
            cpu_changes = _diff(edited, served, "edited", "served on this CPU-only machine")
            print("Adapted for this machine (no GPU, pip-installed Triton):\n" + cpu_changes)
        (self.repository / model / "config.pbtxt").write_text(served)
        client = triton_http.InferenceServerClient(self.triton_http)
        started = time.monotonic()
        client.load_model(model)  # in explicit mode, loading a loaded model reloads it from disk
        print(f"Reloaded {model} in {time.monotonic() - started:.1f} s; ready: {client.is_model_ready(model)}")

    def restore_config(self, model: str) -> None:
        self.apply_config(model, self.config_text(model))

    def served_config(self, model: str) -> dict:
        return triton_http.InferenceServerClient(self.triton_http).get_model_config(model)


def with_instance_groups(config: str, groups: list[tuple[int, list[int]]]) -> str:
    """Replace instance_group with `count` instances on each listed GPU, e.g. [(2, [0]), (2, [1])]."""
    entries = ",\n".join(
        f"  {{\n    count: {count}\n    kind: KIND_GPU\n    gpus: [ {', '.join(map(str, gpus))} ]\n  }}" for count, gpus in groups
    )
    replaced, found = re.subn(r"instance_group\s*\[.*?\n\]", f"instance_group [\n{entries}\n]", config, flags=re.S)
    if not found:
        raise ValueError("config has no instance_group block")
    return replaced


def with_dynamic_batching(config: str, preferred: list[int], max_queue_delay_us: int) -> str:
    """Add (or replace) a dynamic_batching block at the end of the config."""
    without = re.sub(r"\ndynamic_batching\s*\{.*?\}\n", "\n", config, flags=re.S)
    block = (
        f"dynamic_batching {{\n  preferred_batch_size: [ {', '.join(map(str, preferred))} ]\n"
        f"  max_queue_delay_microseconds: {max_queue_delay_us}\n}}\n"
    )
    return without.rstrip("\n") + "\n" + block


def summary_line(result: RunResult) -> str:
    latency = result.latency
    errors = f", {result.error_count} errors" if result.error_count else ""
    return (f"{result.label}: {result.throughput_rps:.1f} req/s, p50 {latency.p50_ms:.1f} ms, "
            f"p95 {latency.p95_ms:.1f} ms, p99 {latency.p99_ms:.1f} ms ({result.requests} requests{errors})")


def _fastapi_flavor(url: str) -> str:
    """Which FastAPI service answers at url, from the runtime its /health reports."""
    runtime = requests.get(f"{url}/health", timeout=5).json()["runtime"]
    return "onnx" if runtime.startswith("onnxruntime") else "pt"


def _stop_and_clean(stack: LocalStack, work: Path) -> None:
    stack.stop()
    shutil.rmtree(work, ignore_errors=True)


def _model_file(model: str) -> str:
    return "food11.pth" if model == "food_classifier" else "model.onnx"


def _diff(before: str, after: str, before_name: str, after_name: str) -> str:
    return "".join(difflib.unified_diff(before.splitlines(True), after.splitlines(True), before_name, after_name))


def _answers(url: str) -> bool:
    try:
        return requests.get(url, timeout=2).status_code == 200
    except requests.RequestException:
        return False

