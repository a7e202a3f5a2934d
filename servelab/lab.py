"""What the notebooks use: one lab, two targets.

    from servelab.lab import Lab
    lab = Lab.connect()

LAB_TARGET chooses the target:
- `local` (the default): the embedded stack on 127.0.0.1, CPU only. A stack already started with
  `make up` is used; otherwise the notebook starts one and stops it when its kernel exits.
- `chameleon`: the Docker Compose services on the GPU node, reached by their service names from
  the Jupyter container.

LAB_PROFILE chooses how long each measurement runs (servelab.profiles): `full` (the default) or
`quick` (CI; every experiment still runs, with short windows).

A Triton config change is made on the config as shipped (`lab.config(model)`, a
`servelab.triton_config.TritonConfig`), shown as the exact text change to `config.pbtxt`, and
applied by reloading that one model through Triton's model-control API (the server runs with
explicit model control, on both targets). Locally the edited config is adapted to the CPU first,
and that adaptation is printed too.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import logging
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import requests
import tritonclient.http as triton_http
from tritonclient.utils import InferenceServerException

from servelab import loadgen, paths, perf_analyzer, plots, triton_local, ui
from servelab.environment import chameleon_only, current_target  # noqa: F401 (notebooks import them from here too)
from servelab.expectations import Expectation, ExpectationLog
from servelab.models import ModelRepository
from servelab.profiles import Profile, profile
from servelab.results import RunResult
from servelab.stack import LocalStack, Ports, answers, fastapi_service, gourmetgram_service, triton_service
from servelab.triton_config import ConfigError, TritonConfig

log = logging.getLogger(__name__)

NOTEBOOK_STACK_DIR = paths.LAB_DIR / "notebook-stack"


@dataclass
class Lab:
    target: str
    profile: Profile
    fastapi_urls: dict[str, str]  # flavor ("pt"/"onnx") -> http://host:port
    triton_http: str | None  # host:port; None when this notebook runs without Triton
    triton_grpc: str | None
    repository: Path | None  # the model repository the running Triton loads
    source: Path = paths.MODELS_STAGING_DIR  # the models as shipped
    gourmetgram_url: str | None = None
    has_gpu: bool = False
    results: list[RunResult] = field(default_factory=list)
    expectations: ExpectationLog = field(default_factory=ExpectationLog)
    _stacks: list[LocalStack] = field(default_factory=list, repr=False)

    # ---- connecting ------------------------------------------------------------------------

    @classmethod
    def connect(cls, triton: bool = True) -> Lab:
        """Connect to the target's services; locally, `triton=False` starts FastAPI only (faster)."""
        logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
        chosen = profile()
        lab = cls._chameleon(chosen) if current_target() == "chameleon" else cls._local(chosen, triton)
        print(lab.describe())
        return lab

    @classmethod
    def _chameleon(cls, chosen: Profile) -> Lab:
        triton = os.environ.get("TRITON_SERVER_URL", "triton_server:8000")
        fastapi = os.environ.get("FASTAPI_SERVER_URL", "http://fastapi_server:8000")
        return cls(
            target="chameleon",
            profile=chosen,
            fastapi_urls={_fastapi_flavor(fastapi): fastapi} if answers(f"{fastapi}/health") else {},
            triton_http=triton,
            triton_grpc=triton.rsplit(":", 1)[0] + ":8001",
            repository=paths.MODELS_STAGING_DIR,  # mounted into the Triton container as /models
            gourmetgram_url=os.environ.get("GOURMETGRAM_URL", "http://flask:5000"),
            has_gpu=True,
        )

    @classmethod
    def _local(cls, chosen: Profile, triton: bool) -> Lab:
        default = Ports.from_env()
        running = answers(f"http://127.0.0.1:{default.fastapi_pt}/health")
        if running and answers(f"http://127.0.0.1:{default.triton_http}/v2/health/ready"):
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
            repository, stacks = (work / "triton" / "models" if triton else None), [stack]
        with_triton = triton or not stacks
        return cls(
            target="local",
            profile=chosen,
            fastapi_urls={
                "pt": f"http://127.0.0.1:{ports.fastapi_pt}",
                "onnx": f"http://127.0.0.1:{ports.fastapi_onnx}",
            },
            triton_http=f"127.0.0.1:{ports.triton_http}" if with_triton else None,
            triton_grpc=f"127.0.0.1:{ports.triton_grpc}" if with_triton else None,
            repository=repository,
            _stacks=stacks,
        )

    @property
    def on_chameleon(self) -> bool:
        return self.target == "chameleon"

    @property
    def models(self) -> ModelRepository:
        return ModelRepository(self.source)

    def describe(self) -> str:
        where = (
            "Chameleon GPU node (Docker Compose services)"
            if self.on_chameleon
            else "this machine, CPU only (local stack)"
        )
        lines = [
            f"Target: {self.target} -- {where}; profile: {self.profile.name}",
            *(f"  FastAPI ({flavor}): {url}" for flavor, url in self.fastapi_urls.items()),
        ]
        if self.triton_http:
            lines.append(f"  Triton: HTTP {self.triton_http}, gRPC {self.triton_grpc}")
        return "\n".join(lines)

    def stop(self) -> None:
        """Stop what this notebook started (nothing, when it uses `make up` or Docker)."""
        for stack in self._stacks:
            stack.stop()
        self._stacks.clear()

    # ---- requests and measurements ---------------------------------------------------------

    @staticmethod
    def sample_image() -> bytes:
        return paths.SAMPLE_IMAGE.read_bytes()

    def fastapi_url(self, flavor: str) -> str:
        if flavor not in self.fastapi_urls and self.on_chameleon:
            # The student may have switched the server since connecting: ask it what it runs now.
            url = os.environ.get("FASTAPI_SERVER_URL", "http://fastapi_server:8000")
            if answers(f"{url}/health"):
                self.fastapi_urls = {_fastapi_flavor(url): url}
        if flavor not in self.fastapi_urls:
            raise RuntimeError(
                f"The FastAPI server runs {', '.join(self.fastapi_urls) or 'nothing reachable'}, not {flavor}. "
                f"Switch it on the node with FASTAPI_SERVICE=fastapi_{flavor} docker compose "
                "-f docker/docker-compose-fastapi.yaml up -d --build fastapi_server"
            )
        return self.fastapi_urls[flavor]

    @contextlib.contextmanager
    def fastapi_variant(self, flavor: str, slots: int | None = None, threads: int | None = None) -> Iterator[str]:
        """A private FastAPI service of `flavor` with `slots` inference slots (PREDICT_CONCURRENCY)
        and `threads` threads per inference (INFERENCE_THREADS); None keeps the default. It runs on
        127.0.0.1 of the machine this notebook runs on (locally, or in the Jupyter container on
        the node, next to the GPU), for the `with` block: `with lab.fastapi_variant("pt", 2, 1) as url:`."""
        env = {
            name: str(value)
            for name, value in (("PREDICT_CONCURRENCY", slots), ("INFERENCE_THREADS", threads))
            if value is not None
        }
        port = Ports.free().fastapi_pt
        work = NOTEBOOK_STACK_DIR / f"variant-{os.getpid()}"
        with LocalStack([fastapi_service(flavor, port, env=env)], log_dir=work / "logs"):
            yield f"http://127.0.0.1:{port}"

    def _triton(self) -> str:
        if not self.triton_http:
            raise RuntimeError("This notebook connected without Triton (Lab.connect(triton=False)).")
        return self.triton_http

    def predict(self, flavor: str, image: bytes | None = None) -> dict:
        """One real request to FastAPI's /predict, as the Swagger page would send it."""
        payload = {"image": base64.b64encode(image or self.sample_image()).decode()}
        response = requests.post(f"{self.fastapi_url(flavor)}/predict", json=payload, timeout=60)
        response.raise_for_status()
        return response.json()

    def sequential(self, flavor: str, url: str | None = None, target: str | None = None) -> RunResult:
        """One request at a time, as many as the profile says: the latency without queueing.
        Against the `flavor` service, or the one at `url`, recorded as `target`."""
        result = loadgen.closed_loop(
            "fastapi",
            url or self.fastapi_url(flavor),
            concurrency=1,
            requests=self.profile.sequential_requests,
            warmup_requests=3,
            image_bytes=self.sample_image(),
            progress=False,
        )
        return self._keep(result, target or f"fastapi_{flavor}")

    def concurrent(self, flavor: str, concurrency: int, url: str | None = None, target: str | None = None) -> RunResult:
        """`concurrency` senders for the profile's duration, against the `flavor` service (or the
        one at `url`, recorded as `target`)."""
        result = loadgen.closed_loop(
            "fastapi",
            url or self.fastapi_url(flavor),
            concurrency=concurrency,
            duration_s=self.profile.duration_s,
            warmup_s=self.profile.warmup_s,
            image_bytes=self.sample_image(),
            progress=False,
        )
        return self._keep(result, target or f"fastapi_{flavor}")

    def perf(
        self,
        model: str,
        concurrency: int | None = 1,
        batch_size: int = 1,
        rate: float | None = None,
        distribution: str = "constant",
        **options,
    ) -> RunResult:
        """perf_analyzer against Triton, with this profile's measurement windows. `options` go to
        servelab.perf_analyzer.run (e.g. shape=[...]) and override the model's defaults."""
        model_input = self.models.get(model).perf_analyzer_input(self.sample_image(), paths.LAB_DIR)
        result = perf_analyzer.run(
            self._triton(),
            model,
            concurrency=None if rate else concurrency,
            request_rate=rate,
            request_distribution=distribution,
            batch_size=batch_size,
            measurement_interval_ms=self.profile.perf_window_ms,
            stability_percentage=50,
            max_trials=5,
            timeout_s=600,
            **{**model_input, **options},
        ).results[0]
        return self._keep(result, result.target)

    def measure(self, model: str, attempts: int = 2, **load) -> RunResult | None:
        """`perf`, tried up to `attempts` times while perf_analyzer finds no stable measurement;
        None (said in the output) when no attempt gave a number. The result's target names the
        model's current instance count, so runs under different configurations stay apart."""
        for attempt in range(1, attempts + 1):
            try:
                result = self.perf(model, **load)
                break
            except perf_analyzer.NoStableMeasurement as unstable:
                print(f"{model} {load}: {unstable.meaning} (attempt {attempt} of {attempts}).")
        else:
            print(f"{model} {load}: perf_analyzer gave up every time, so this run has no result.")
            return None
        instances = self.served_instances(model)
        result.target += f", {instances} instance{'s' if instances > 1 else ''}"
        return result

    def _keep(self, result: RunResult, target: str) -> RunResult:
        result.target = target
        self.results.append(result)
        print(summary_line(result))
        return result

    def breakdown(self, results: Mapping[str, RunResult | None]) -> str:
        """Print where the time went (Triton's breakdown) for named perf_analyzer runs."""
        table = plots.breakdown_table(results)
        print(table)
        return table

    def scale_rates(self, rates: list[float], model: str = "food_classifier_onnx") -> list[float]:
        """The request rates to use here for an experiment written for two P100 GPUs.

        On Chameleon they are used as written. Locally, the capacity of one `model` instance is
        measured, and the rates are scaled so that the highest one is 90% of it: the experiment
        keeps its shape (light load to near saturation) on a machine many times slower.
        """
        if self.on_chameleon:
            return list(rates)
        capacity = (
            perf_analyzer.run(
                self._triton(),
                model,
                concurrency=4,
                measurement_interval_ms=self.profile.perf_window_ms,
                stability_percentage=50,
                max_trials=5,
                **self.models.get(model).perf_analyzer_input(self.sample_image(), paths.LAB_DIR),
            )
            .results[0]
            .throughput_rps
        )
        factor = 0.9 * capacity / max(rates)
        scaled = [round(rate * factor, 1) for rate in rates]
        print(
            f"This machine serves about {capacity:.1f} req/s with one {model} instance (measured just now). "
            f"The lab's rates {rates} req/s were chosen for a P100 GPU; here they are scaled by "
            f"{factor:.3f} to {scaled} req/s, so the highest is 90% of this machine's capacity."
        )
        return scaled

    def table(self, results: list[RunResult] | None = None) -> str:
        table = plots.results_table(results if results is not None else self.results)
        print(table)
        return table

    # ---- lesson checks ---------------------------------------------------------------------

    def expect(self, claim: str, held: bool, evidence: str, reason: str = "") -> Expectation:
        """Record what the lesson expected, and whether this run's numbers (the evidence) bore it out."""
        return self.expectations.judge(claim, bool(held), evidence, reason)

    def not_checked(self, claim: str, missing: list[str]) -> Expectation:
        """Record that an expectation could not be judged: these runs gave no number."""
        return self.expectations.not_checked(claim, f"no stable measurement for {', '.join(missing)}")

    def verdicts(self) -> str:
        """Every expectation of this notebook and its outcome, one line each."""
        summary = self.expectations.summary()
        print(summary)
        return summary

    # ---- the web UI -----------------------------------------------------------------------

    def ui(self, backend: str) -> str:
        """GourmetGram's URL for a backend: started here locally; the `flask` container on Chameleon."""
        if self.on_chameleon:
            return self.gourmetgram_url
        port = Ports.free().gourmetgram
        ports = Ports(
            fastapi_pt=int(self.fastapi_urls["pt"].rsplit(":", 1)[1]),
            fastapi_onnx=int(self.fastapi_urls["onnx"].rsplit(":", 1)[1]),
            triton_http=int(self.triton_http.rsplit(":", 1)[1]) if self.triton_http else Ports().triton_http,
        )
        stack = LocalStack([gourmetgram_service(port, backend, ports)], log_dir=NOTEBOOK_STACK_DIR / "ui-logs").start()
        self._stacks.append(stack)
        atexit.register(stack.stop)
        return f"http://127.0.0.1:{port}"

    @staticmethod
    def upload_to_ui(ui_url: str, image_name: str, image: bytes) -> ui.PageAnswer:
        """Upload a photo as GourmetGram's form does, and print what the result page says; a page
        that is not a prediction (the backend down, say) is an error that quotes the page."""
        answer = ui.upload(ui_url, image_name, image)
        print(answer)
        if answer.status != 200:
            raise RuntimeError(f"GourmetGram at {ui_url} answered HTTP {answer.status}: {answer.error}")
        return answer

    # ---- Triton model configs ----------------------------------------------------------------

    def config(self, model: str) -> TritonConfig:
        """The model's config as shipped for the GPU node (what a student edits).

        On Chameleon it is read from git, not from the file: the server there loads
        models_staging/ itself, so after an edit the file no longer holds the shipped text.
        """
        info = self.models.get(model)
        if self.on_chameleon:
            relative = f"models_staging/{model}/config.pbtxt"
            shipped = subprocess.run(
                ["git", "show", f"HEAD:{relative}"], cwd=paths.REPO_ROOT, capture_output=True, text=True
            )
            if shipped.returncode == 0:
                return TritonConfig(shipped.stdout, origin=relative)
        return info.config

    def served_config(self, model: str) -> dict:
        """What Triton reports it runs for `model` (its own defaults filled in)."""
        return triton_http.InferenceServerClient(self._triton()).get_model_config(model)

    def served_instances(self, model: str) -> int:
        """How many instances of `model` Triton runs now, from what the server itself reports."""
        groups = self.served_config(model).get("instance_group", [])
        # On a GPU group, `count` instances run on *each* listed GPU.
        return sum(group["count"] * max(1, len(group.get("gpus") or [])) for group in groups)

    def apply_config(self, model: str, edited: TritonConfig | str) -> None:
        """Show the edit as a diff, write it where the server reads it, and reload that one model.

        `edited` is a TritonConfig (e.g. `lab.config(model).with_dynamic_batching(...)`) or the
        text of one; either way it is checked against Triton's schema before Triton sees it.
        """
        info = self.models.get(model)
        if isinstance(edited, str):
            edited = TritonConfig(edited, origin=f"{model}/config.pbtxt (edited)")
        if edited.name not in ("", model):
            raise ConfigError(f'The edited config says name: "{edited.name}", but it is applied to {model}.')
        shipped = self.config(model)
        print(
            shipped.diff(edited, f"{model}/config.pbtxt (as shipped)", f"{model}/config.pbtxt (edited)")
            or f"{model}/config.pbtxt: back to the config as shipped"
        )
        served = edited
        if not self.on_chameleon:
            served = triton_local.served_config(info, edited, self.repository / model)
            print(
                "Adapted for this machine (no GPU, pip-installed Triton):\n"
                + edited.diff(served, "edited", "served on this CPU-only machine")
            )
        (self.repository / model / "config.pbtxt").write_text(served.text)
        client = triton_http.InferenceServerClient(self._triton())
        started = time.monotonic()
        try:
            client.load_model(model)  # in explicit mode, loading a loaded model reloads it from disk
        except InferenceServerException as exc:
            raise ConfigError(f"Triton refused the edited config of {model}: {exc.message()}") from None
        print(f"Reloaded {model} in {time.monotonic() - started:.1f} s; ready: {client.is_model_ready(model)}")

    def restore_config(self, model: str) -> None:
        self.apply_config(model, self.config(model))


def summary_line(result: RunResult) -> str:
    latency = result.latency
    errors = f", {result.error_count} errors" if result.error_count else ""
    return (
        f"{result.label}: {result.throughput_rps:.1f} req/s, p50 {latency.p50_ms:.1f} ms, "
        f"p95 {latency.p95_ms:.1f} ms, p99 {latency.p99_ms:.1f} ms ({result.requests} requests{errors})"
    )


def _fastapi_flavor(url: str) -> str:
    """Which FastAPI service answers at url, from the runtime its /health reports."""
    runtime = requests.get(f"{url}/health", timeout=5).json()["runtime"]
    return "onnx" if runtime.startswith("onnxruntime") else "pt"


def _stop_and_clean(stack: LocalStack, work: Path) -> None:
    stack.stop()
    shutil.rmtree(work, ignore_errors=True)
