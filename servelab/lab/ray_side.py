"""The Ray Serve half of the notebooks' Lab (notebook 9): one Ray Serve to edit, redeploy and watch.

    serve = lab.ray_serve()
    serve.config_file.read_text()              # ray_serve/serve_config.yaml, as shipped
    answer = serve.predict()                   # one request with the sample photo: Serve's answer
    config = serve.shipped_config()            # that file, as a dict
    serve.deployment_options(config)["max_ongoing_requests"] = 2
    serve.apply(config)                        # shows the edit, deploys it, waits until it runs
    with serve.watch() as watcher: ...         # replicas, ongoing and queued requests over time
    load = serve.step_load(lab.measurer.closed_loop, [(1, 1), (12, 1)], "ray_serve", autoscaling)  # steps of step_s
    serve.show_step_load(load, max_ongoing=4)  # its table and plot

Where it runs:
- locally, the Ray Serve of `make up` when it runs (the shipped config is deployed again when the
  notebook's kernel exits), else one the notebook starts on free ports and stops at exit;
- in the Compose project, the `ray_serve` service, reached by its service name: its dashboard
  (Serve's REST API) and its metrics are open to the Compose network only, behind Ray's token,
  which the service writes to a volume the Jupyter container shares, with its hardware.

Every config goes through Serve's REST API, as `serve deploy` would send it. It is adapted first
to the hardware of the Ray that serves it (servelab.service.serve_config: CPU shares instead of
GPUs where Ray has no GPU; locally also 127.0.0.1 and the lab's port, servelab.ray.local), and the
adaptation is printed too.
"""

from __future__ import annotations

import atexit
import base64
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

from servelab import paths
from servelab.lessons.concurrency_target import Step, StepLoad, step_table
from servelab.measure import timeline
from servelab.profiles import profile
from servelab.ray import local as ray_local
from servelab.ray import rest as ray_rest
from servelab.ray.watch import ServeWatcher
from servelab.results import RunResult
from servelab.service.cores import available_cores
from servelab.service.hardware import Hardware
from servelab.service.serve_config import for_hardware
from servelab.settings import settings
from servelab.stack.catalogue import ray_serve_service
from servelab.stack.supervision import LocalStack, Ports, answers, start_on_free_ports

APPLICATION, DEPLOYMENT = "food11", "Food11"


@dataclass
class RayServe:
    url: str  # Serve's HTTP proxy: the app's /predict
    dashboard: str  # Ray's dashboard: Serve's REST API
    metrics_url: str  # Ray's Prometheus metrics, Serve's among them
    token_file: Path
    local_port: int | None  # the proxy's port on this machine; None in the Compose project
    # Whether this Serve outlives the notebook (the Compose project's, `make up`'s): then it gets
    # its shipped config back when the notebook is done with it; one started here stops with it.
    outlives_the_notebook: bool = True
    # What the Ray that serves the replicas has: locally this machine's cores, no GPU.
    hardware: Hardware = field(default_factory=lambda: Hardware(gpus=0, cores=available_cores()))

    @property
    def config_file(self) -> Path:
        """The config as shipped (ray_serve/serve_config.yaml): what every edit starts from."""
        return ray_local.CONFIG_PATH

    def shipped_config(self) -> dict[str, Any]:
        return ray_local.read_config(self.config_file)

    def predict(self, image: bytes | None = None) -> requests.Response:
        """One request to the app's /predict, as FastAPI's contract has it (the photo in base64; by
        default the lab's sample photo): Serve's answer, with the headers that name the replica."""
        payload = {"image": base64.b64encode(image or paths.SAMPLE_IMAGE.read_bytes()).decode()}
        return requests.post(f"{self.url}/predict", json=payload, timeout=60)

    @staticmethod
    def deployment_options(config: dict[str, Any]) -> dict[str, Any]:
        """The Food-11 deployment's options in `config` (its entry under the application's
        `deployments`: what `@serve.deployment(...)` takes), to edit in place."""
        (application,) = [app for app in config["applications"] if app["name"] == APPLICATION]
        (deployment,) = [d for d in application["deployments"] if d["name"] == DEPLOYMENT]
        return deployment

    def served(self, config: dict[str, Any]) -> dict[str, Any]:
        if self.local_port is None:
            return for_hardware(config, self.hardware)
        return ray_local.adapt_for_local(config, self.local_port, self.hardware.cores)

    def apply(self, config: dict[str, Any], timeout_s: float = 240.0, quiet: bool = False) -> None:
        """Check `config` against Serve's schema, show how it differs from the shipped one (and,
        locally, how it is adapted), deploy it, and wait until every replica it asks for runs."""
        ray_local.check_config(config, "the edited config")
        served = self.served(config)
        if not quiet:
            shipped = self.shipped_config()
            print(
                ray_local.config_diff(shipped, config).replace("served on this machine", "edited")
                or "serve_config.yaml: as shipped"
            )
            if served is not config:
                print(f"Adapted for Ray Serve's hardware ({self.hardware.describe()}):")
                print(ray_local.config_diff(config, served).replace("serve_config.yaml", "edited"))
        started = time.monotonic()
        self._deploy(served, timeout_s)
        if not quiet:
            print(f"Deployed in {time.monotonic() - started:.1f} s: {self.replicas()}")

    def redeploy(self, application: dict[str, Any], timeout_s: float = 240.0) -> None:
        """Deploy the Food-11 app as Serve once reported it (`deployed_app`), and wait for it."""
        self._deploy({**self.served(self.shipped_config()), "applications": [application]}, timeout_s)

    def _deploy(self, served: dict[str, Any], timeout_s: float) -> None:
        """Send `served` (a whole config, as it is to run) to Serve; return once it runs."""
        started = time.monotonic()
        ray_rest.deploy(self.dashboard, served, self.token_file)
        (application,) = [app for app in served["applications"] if app["name"] == APPLICATION]
        while True:
            found = ray_rest.applications(self.dashboard, self.token_file).get(APPLICATION, {})
            deployment = found.get("deployments", {}).get(DEPLOYMENT, {})
            states = [replica["state"] for replica in deployment.get("replicas", [])]
            if (
                found.get("deployed_app_config") == application
                and found.get("status") == "RUNNING"
                and deployment.get("status") == "HEALTHY"
                and states.count("RUNNING") == len(states) == deployment.get("target_num_replicas")
            ):
                break
            if time.monotonic() - started > timeout_s:
                raise TimeoutError(
                    f"Ray Serve did not bring {APPLICATION} to the new config in {timeout_s:.0f} s: application "
                    f"{found.get('status')} {found.get('message', '')}, deployment {deployment.get('status')} "
                    f"{deployment.get('message', '')}, replicas {states}"
                )
            time.sleep(0.5)

    def restore(self) -> None:
        """Back to the config as shipped."""
        self.apply(self.shipped_config(), quiet=True)

    def release(self) -> None:
        """The notebook is done with Serve: one that outlives it (the Compose project's, `make up`'s)
        goes back as shipped, once (not again at the kernel's exit); one started here stops with it."""
        if self.outlives_the_notebook:
            self.restore()
            atexit.unregister(self.restore)

    def deployed_app(self) -> dict[str, Any] | None:
        """The Food-11 app's config as Serve deployed it, by its own account (None: not deployed)."""
        return ray_rest.applications(self.dashboard, self.token_file).get(APPLICATION, {}).get("deployed_app_config")

    def replicas(self) -> dict[str, int]:
        """Serve's own count of the deployment's replicas, by state."""
        return ray_rest.replicas_by_state(self.dashboard, APPLICATION, DEPLOYMENT, self.token_file)

    def watch(self, interval_s: float = 1.0) -> ServeWatcher:
        return ServeWatcher(self.dashboard, self.metrics_url, APPLICATION, DEPLOYMENT, self.token_file, interval_s)

    def step_load(
        self,
        closed_loop: Callable[..., RunResult],
        steps: list[tuple[int, float]],
        label: str,
        autoscaling: dict[str, Any],
        step_s: float | None = None,
    ) -> StepLoad:
        """Each (clients, length) step in turn against this Serve, deployed with `autoscaling` (its
        autoscaling_config), with `closed_loop` (the lab's, which keeps each run as "<label>, step of
        N client(s)"), while Serve is watched: Serve's samples, and the steps on the watcher's time
        axis. A length counts steps of `step_s` seconds: by default the profile's (LAB_PROFILE), long
        enough for the autoscaler to act, and short in the quick one."""
        step_s = profile(settings().profile).step_s if step_s is None else step_s
        ran = []
        with self.watch() as watcher:
            for clients, length in steps:
                start = watcher.now_s()
                run = closed_loop(self.url, clients, length * step_s, name=f"{label}, step of {clients} client(s)")
                ran.append(Step(start, watcher.now_s(), clients, run))
        failed = dict(watcher.failures) or "none"
        print(f"Steps of {step_s:g} s; {len(watcher.samples)} samples of Serve's state; polls that failed: {failed}")
        return StepLoad(watcher.samples, ran, autoscaling)

    @staticmethod
    def show_step_load(load: StepLoad, max_ongoing: int) -> None:
        """A step load's table (servelab.lessons.concurrency_target.step_table), then its plot."""
        import matplotlib.pyplot as plt

        print(step_table(load))
        plot_step_load(load, max_ongoing)
        plt.show()


def compose() -> RayServe:
    """The Compose project's Ray Serve, as its Jupyter container reaches it."""
    given = settings()
    shared = Path(given.compose("ray_shared_dir"))
    return RayServe(
        url=given.compose("ray_serve_url"),
        dashboard=given.compose("ray_dashboard_url"),
        metrics_url=given.compose("ray_metrics_url"),
        token_file=shared / "token",
        local_port=None,
        hardware=Hardware.read(shared / "hardware.json"),
    )


def local(stacks: list[LocalStack], work: Path) -> RayServe:
    """The Ray Serve of `make up` if it runs, else one started here (added to `stacks`)."""
    default = Ports.configured()
    if answers(f"http://127.0.0.1:{default.ray_serve}/health") and ray_rest.TOKEN_FILE.exists():
        serve = serve_at(default, ray_rest.TOKEN_FILE)
        print(
            "Using the Ray Serve already running on this machine (`make up`); its shipped config returns when the "
            "notebook stops (lab.stop(), or the kernel's exit)."
        )
        atexit.register(serve.restore)
        return serve
    token_file = work / "ray_auth_token"
    print("Starting Ray Serve for this notebook (a one-node Ray on 127.0.0.1; about half a minute)...")
    stack, ports = start_on_free_ports(
        lambda ports: [ray_serve_service(ports, token_file=token_file)], work / "ray-logs"
    )
    stacks.append(stack)
    atexit.register(stack.stop)
    return serve_at(ports, token_file, outlives_the_notebook=False)


def serve_at(ports: Ports, token_file: Path, outlives_the_notebook: bool = True) -> RayServe:
    """The lab's client of a Ray Serve running on this machine on `ports`, behind `token_file`'s token."""
    return RayServe(
        url=f"http://127.0.0.1:{ports.ray_serve}",
        dashboard=f"http://127.0.0.1:{ports.ray_dashboard}",
        metrics_url=f"http://127.0.0.1:{ports.ray_metrics}/metrics",
        token_file=token_file,
        local_port=ports.ray_serve,
        outlives_the_notebook=outlives_the_notebook,
    )


def plot_step_load(load: StepLoad, max_ongoing: int, width_s: float | None = None):
    """A step load on one time axis: clients and replicas; requests inside the replicas (with
    what the running replicas may hold, and what makes Serve add one: replicas x its target) and
    queued in front; the clients' p50 and p95 per window (`width_s`; by default a tenth of the
    median step, at least 1 s); answers and refusals per second with the CPU use."""
    import matplotlib.pyplot as plt

    samples, steps = load.samples, load.steps
    target = load.autoscaling.get("target_ongoing_requests")
    if width_s is None:
        width_s = max(1.0, statistics.median(step.end_s - step.start_s for step in steps) / 10)
    figure, (counts, requests_, latency, rate) = plt.subplots(4, 1, sharex=True, figsize=(10, 10))
    t = [sample.t_s for sample in samples]
    counts.step([start for start, *_ in steps], [clients for _, _, clients, _ in steps], where="post", label="clients")
    counts.plot(t, [sample.running for sample in samples], "o-", label="replicas running (Serve's status)")
    counts.set_ylabel("count")
    requests_.plot(t, [sample.ongoing for sample in samples], label="inside the replicas")
    requests_.plot(t, [sample.queued for sample in samples], label="queued in front")
    requests_.plot(t, [sample.running * max_ongoing for sample in samples], "--", label="replicas x max_ongoing")
    if target is not None:
        requests_.plot(t, [sample.running * target for sample in samples], ":", label="replicas x target")
    requests_.set_ylabel("requests")
    windows = [window for start, _, _, run in steps for window in timeline.windows(run, width_s, start)]
    middle = [(window.start_s + window.end_s) / 2 for window in windows]
    latency.plot(middle, [window.p50_ms for window in windows], "o-", label="p50")
    latency.plot(middle, [window.p95_ms for window in windows], "o-", label="p95")
    latency.set_ylabel("client latency (ms)")
    rate.plot(middle, [window.throughput_rps for window in windows], "o-", label="answered / s")
    refused = [sum(window.errors.values()) / (window.end_s - window.start_s) for window in windows]
    rate.plot(middle, refused, "x-", label="refused or failed / s")
    rate.set_ylabel("requests / s")
    cpu = rate.twinx()
    cpu.plot(t, [sample.cpu_percent for sample in samples], ":", color="gray", label="CPU %")
    cpu.set_ylim(0, 105)
    cpu.set_ylabel("CPU % (all cores)")
    rate.set_xlabel("seconds")
    for axes in (counts, requests_, latency, rate):
        axes.legend(loc="upper left", fontsize="small")
        for start, *_ in steps[1:]:
            axes.axvline(start, color="lightgray", linewidth=0.8)
    cpu.legend(loc="upper right", fontsize="small")
    figure.suptitle("Ray Serve under a step load: replicas, queue, latency")
    figure.tight_layout()
    return figure
