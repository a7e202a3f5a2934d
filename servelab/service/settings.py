"""Every setting a service reads from its environment, read in one place, once, at start-up.

The FastAPI services (fastapi_pt, fastapi_onnx) and every Ray Serve replica build one
`ServiceSettings` when they start (`ServiceSettings.at_start_up()`), and nothing else in them reads
the environment. A value the service cannot use stops it with a message that names the variable
and says what it may be; unset (or empty) means the default.

Variable                  Default                  Meaning
SERVICE_PROCESSES         planned (cores.py)       processes that serve (uvicorn's workers, started by
                                                   servelab.service.launch): one per 2 cores on a CPU, one per 4
                                                   (at most 4) beside a GPU; they share the cores out
PREDICT_CONCURRENCY       a slot per core; 1 (GPU) inference slots of each process: inferences that run at once
INFERENCE_THREADS         elastic (CPU)            threads per inference, fixed; unset on a CPU, an inference
                                                   gets the cores divided by the inferences running (cores.py)
INFERENCE_DEVICE          auto                     auto (the GPU when the runtime has one), cuda or cpu (devices.py)
PREPROCESS_WORKERS        1 per 2 slots; every     threads of each process that decode and preprocess images
                          core (GPU)
DECODE_AHEAD              2 per slot, at least     requests decoded, or being decoded, ahead of the predict slots
                          PREPROCESS_WORKERS       (scheduler.py)
MAX_REQUEST_BYTES         16777216 (16 MiB)        the largest request body, and the largest image fetched by URL
IMAGE_URL_ALLOWED_HOSTS   127.0.0.1:8400           hosts images are fetched from by URL: `host` (any port) or
                                                   `host:port`, comma-separated (image_fetch.py)
IMAGE_DOWNLOAD_TIMEOUT_S  10                       seconds a download by URL may take, redirects included
IMAGE_DOWNLOAD_PLACEMENT  outside_slot             or inside_slot: the download holds the predict slot (the naive
                                                   design, notebook 8)
ABANDON_ON_DISCONNECT     on                       a request whose client left stops at its next stage, a /refine
                                                   stream at its next step; off: computed anyway (notebook 10)
FOOD11_MODEL_PATH         the model beside app.py  the model file: food11.pth (fastapi_pt), food11.onnx
                                                   (fastapi_onnx, ray_serve)
SERVELAB_LOOPBACK_ONLY    off                      Ray Serve: on keeps each replica's gRPC server on 127.0.0.1
                                                   (the local stack sets it)

A switch takes on or off (also true/false, yes/no, 1/0). These are the services' settings; the
lab's tools (the local stack, the notebooks) and Triton's models are configured on their own.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from servelab.service.cores import (
    ServicePlan,
    ThreadPlan,
    available_cores,
    positive_int_setting,
    service_plan,
    thread_plan,
)
from servelab.service.devices import device_setting
from servelab.service.image_fetch import DEFAULT_ALLOWED_HOSTS, AllowList

DEFAULT_MAX_REQUEST_BYTES = 16 * 1024 * 1024
DEFAULT_DOWNLOAD_TIMEOUT_S = 10.0
PLACEMENTS = ("outside_slot", "inside_slot")
ON = ("on", "true", "yes", "1")
OFF = ("off", "false", "no", "0")
T = TypeVar("T")


class ServiceSettingError(ValueError):
    """A variable holds a value the service cannot use; the message names it and says what to set."""


def _raw(environ: Mapping[str, str], name: str) -> str:
    return environ.get(name, "").strip()


def _positive_int(environ: Mapping[str, str], name: str) -> int | None:
    return positive_int_setting(name, environ)


def _seconds(environ: Mapping[str, str], name: str, default: float) -> float:
    raw = _raw(environ, name)
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a number of seconds: set it above 0 (default {default:g}).") from None
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name}={raw!r}: set it to a number of seconds above 0 (default {default:g}).")
    return value


def _choice(environ: Mapping[str, str], name: str, choices: tuple[str, ...]) -> str:
    value = _raw(environ, name) or choices[0]
    if value not in choices:
        raise ValueError(f"{name}={value!r}: use {' or '.join(choices)} (or unset it, for {choices[0]}).")
    return value


def _switch(environ: Mapping[str, str], name: str, default: bool) -> bool:
    raw = _raw(environ, name).lower()
    if not raw:
        return default
    if raw in ON or raw in OFF:
        return raw in ON
    raise ValueError(f"{name}={raw!r}: use on or off (or unset it, for {'on' if default else 'off'}).")


def _allow_list(environ: Mapping[str, str], name: str) -> AllowList:
    return AllowList.parse(environ.get(name, DEFAULT_ALLOWED_HOSTS))  # its errors name the variable


def _path(environ: Mapping[str, str], name: str) -> Path | None:
    raw = _raw(environ, name)
    return Path(raw) if raw else None


@dataclass(frozen=True)
class ServiceSettings:
    """A service's settings, as the table above describes them (None: the default, which depends
    on the device or the app)."""

    processes: int | None = None
    slots: int | None = None  # PREDICT_CONCURRENCY
    inference_threads: int | None = None
    device: str = "auto"
    preprocess_workers: int | None = None
    decode_ahead: int | None = None
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    allowed_hosts: AllowList = AllowList.parse(DEFAULT_ALLOWED_HOSTS)
    download_timeout_s: float = DEFAULT_DOWNLOAD_TIMEOUT_S
    download_placement: str = PLACEMENTS[0]
    abandon_on_disconnect: bool = True
    model_path: Path | None = None
    loopback_only: bool = False

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> ServiceSettings:
        """The settings in `environ`; ServiceSettingError naming the variable at the first bad value."""

        def read(name: str, parse: Callable[..., T], *args) -> T:
            try:
                return parse(environ, name, *args)
            except ValueError as exc:
                raise ServiceSettingError(str(exc)) from None

        return cls(
            processes=read("SERVICE_PROCESSES", _positive_int),
            slots=read("PREDICT_CONCURRENCY", _positive_int),
            inference_threads=read("INFERENCE_THREADS", _positive_int),
            device=read("INFERENCE_DEVICE", lambda environ, _: device_setting(environ)),
            preprocess_workers=read("PREPROCESS_WORKERS", _positive_int),
            decode_ahead=read("DECODE_AHEAD", _positive_int),
            max_request_bytes=read("MAX_REQUEST_BYTES", _positive_int) or DEFAULT_MAX_REQUEST_BYTES,
            allowed_hosts=read("IMAGE_URL_ALLOWED_HOSTS", _allow_list),
            download_timeout_s=read("IMAGE_DOWNLOAD_TIMEOUT_S", _seconds, DEFAULT_DOWNLOAD_TIMEOUT_S),
            download_placement=read("IMAGE_DOWNLOAD_PLACEMENT", _choice, PLACEMENTS),
            abandon_on_disconnect=read("ABANDON_ON_DISCONNECT", _switch, True),
            model_path=read("FOOD11_MODEL_PATH", _path),
            loopback_only=read("SERVELAB_LOOPBACK_ONLY", _switch, False),
        )

    @classmethod
    def at_start_up(cls) -> ServiceSettings:
        """This process's settings; a bad value stops it with the message that says what to set."""
        try:
            return cls.from_environ(os.environ)
        except ServiceSettingError as exc:
            raise SystemExit(str(exc)) from None

    def service_plan(self, device: str) -> ServicePlan:
        """The service's processes and each one's share of the cores, slots and decoding threads,
        for the device the model runs on (cores.py's rules; SERVICE_PROCESSES where set)."""
        return service_plan(available_cores(), device.startswith("cuda"), self.processes)

    def thread_plan(self, device: str) -> ThreadPlan:
        """The slots and threads of this process, on its share of the cores, for the device the model
        runs on: PREDICT_CONCURRENCY and INFERENCE_THREADS where set, the defaults of cores.py otherwise.
        A process started on its own (plain uvicorn, a Ray replica) has every core: SERVICE_PROCESSES
        is set for each of its workers by servelab.service.launch."""
        given = {"PREDICT_CONCURRENCY": self.slots, "INFERENCE_THREADS": self.inference_threads}
        by = ", ".join(f"{name}={value}" for name, value in given.items() if value is not None)
        cores = self.service_plan(device).cores_each if self.processes else available_cores()
        return thread_plan(self.slots, self.inference_threads, device=device, cores=cores, environ={}, given_by=by)

    def preprocess_workers_for(self, device: str, plan: ThreadPlan) -> int:
        """PREPROCESS_WORKERS, else the plan's (cores.py): on a CPU one decoding thread per two slots
        (a decode costs a fraction of an inference, and every extra thread would take cores from the
        inference threads); on a GPU every core of the process's share, since decoding is then the
        CPU's main work."""
        return self.preprocess_workers or service_plan(plan.cores, device.startswith("cuda"), 1).decoding_threads

    def decode_ahead_for(self, plan: ThreadPlan, preprocess_workers: int) -> int:
        """DECODE_AHEAD, else two requests per slot (one for it to take next, one to decode
        meanwhile), and never fewer than the decoding threads, which would leave some of them idle."""
        return self.decode_ahead or max(2 * plan.slots, preprocess_workers)
