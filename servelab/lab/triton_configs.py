"""What the lab's Triton serves, and how a notebook changes it (`lab.triton.configs`): the
config as shipped, what the server reports it runs, an edit shown as a diff and applied by
reloading that one model (Triton runs with explicit model control), the config a student types
written into the file Triton reads (`write_config`), and the server's release and log level. An
edit is adapted to the server's hardware first, and that adaptation is printed too.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import tritonclient.http as triton_http
from tritonclient.grpc import model_config_pb2
from tritonclient.utils import InferenceServerException

from servelab.report.summaries import listed
from servelab.service.hardware import Hardware
from servelab.triton import server as triton_local
from servelab.triton.adaptation import gpus_missing
from servelab.triton.config import ConfigError, TritonConfig
from servelab.triton.models import ModelRepository

# How long a reload may take before apply_config gives up waiting. Each instance of a Python-backend
# model starts a process that imports PyTorch and runs a first inference: four of them on a busy
# 2-core machine took longer than tritonclient's default of 60 s (notebook 6, quick profile).
MODEL_LOAD_TIMEOUT_S = 600.0


class TypedConfigError(ConfigError):
    """Config text a student typed that the lab will not write, saying what is wrong and what to
    change. A notebook shows the message alone, as it shows a step left to type
    (servelab.lab.your_turn), not a traceback through the lab's code."""

    def _render_traceback_(self) -> list[str]:
        return str(self).splitlines()


@dataclass
class ServedConfigs:
    """The lab's Triton's served configs (see the module's docstring)."""

    http: str | None  # the lab's Triton, host:port; None when the notebook connected without Triton
    repository: Path | None  # the model repository the running Triton loads
    server: Hardware  # what the Triton server has: configs are adapted to it
    models: ModelRepository  # the models as shipped

    @property
    def address(self) -> str:
        """The lab's Triton (host:port), for a notebook that connected with it."""
        if not self.http:
            raise RuntimeError("This notebook connected without Triton (Lab.connect(triton=False)).")
        return self.http

    def served_on(self, model: str) -> str:
        """Where Triton runs `model`'s instances, in words ("GPU 0", "the CPU"), as the server reports it."""
        groups = self.served_config(model).get("instance_group", [])
        gpus = sorted({gpu for group in groups if group.get("kind") == "KIND_GPU" for gpu in group.get("gpus", [])})
        places = [f"GPU{'s' if len(gpus) > 1 else ''} {', '.join(map(str, gpus))}"] if gpus else []
        if any(group.get("kind") != "KIND_GPU" for group in groups):
            places.append("the CPU")
        return " and ".join(places)

    def config(self, model: str) -> TritonConfig:
        """The model's config as shipped for the GPU node (what a student edits); the server
        serves a staged copy, so this file never holds an edit."""
        return self.models.get(model).config

    def served_config(self, model: str) -> dict:
        """What Triton reports it runs for `model` (its own defaults filled in)."""
        return triton_http.InferenceServerClient(self.address).get_model_config(model)

    def served_instances(self, model: str) -> int:
        """How many instances of `model` Triton runs now, from what the server itself reports."""
        groups = self.served_config(model).get("instance_group", [])
        # On a GPU group, `count` instances run on *each* listed GPU.
        return sum(group["count"] * max(1, len(group.get("gpus") or [])) for group in groups)

    def apply_config(self, model: str, edited: TritonConfig | str) -> int:
        """Show the edit as a diff, write it where the server reads it, and reload that one model;
        the config as shipped (`lab.triton.configs.config(model)`) puts the model back as it was.

        `edited` is a TritonConfig (e.g. `lab.triton.configs.config(model).with_text("dynamic_batching { }")`) or the
        text of one; either way it is checked against Triton's schema before Triton sees it.
        Returns how many instances of `model` Triton now serves, as it reports them (`served_instances`):
        the count a config asked for is per listed GPU, and the server may have adapted it.
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
        if self.repository is None:
            raise RuntimeError("This notebook connected without Triton (Lab.connect(triton=False)).")
        served = triton_local.served_config(info, edited, self.repository / model, self.server)
        if adaptation := self._adaptation(edited, served, "edited"):
            print(adaptation)
        (self.repository / model / "config.pbtxt").write_text(served.text)
        client = triton_http.InferenceServerClient(self.address, network_timeout=MODEL_LOAD_TIMEOUT_S)
        started = time.monotonic()
        try:
            client.load_model(model)  # in explicit mode, loading a loaded model reloads it from disk
        except InferenceServerException as exc:
            raise ConfigError(f"Triton refused the edited config of {model}: {exc.message()}") from None
        ready, instances = client.is_model_ready(model), self.served_instances(model)
        print(f"Reloaded {model} in {time.monotonic() - started:.1f} s; ready: {ready}; instances served: {instances}")
        return instances

    def _adaptation(self, edited: TritonConfig, served: TritonConfig, written: str) -> str:
        """How this server's Triton serves `edited` (`served`) where that differs, in words and as a
        diff from the config as `written`; "" where it serves it as written."""
        adaptation = edited.diff(served, written, "served by this Triton")
        if not adaptation:
            return ""
        missing = gpus_missing(edited, self.server)
        if missing:
            why = (
                f": the instances written for GPU {listed([str(gpu) for gpu in missing])}, which it lacks, run on "
                f"GPU {listed([str(gpu) for gpu in sorted({gpu % self.server.gpus for gpu in missing})])}, "
                "as many as written"
            )
        elif not self.server.gpus and any(
            group.kind == model_config_pb2.ModelInstanceGroup.KIND_GPU for group in edited.proto.instance_group
        ):  # Triton refuses to load a KIND_GPU group on a server without a GPU
            why = ": it has no GPU, so each KIND_GPU group runs its count of instances on the CPU (KIND_CPU)"
        else:
            why = ""
        return f"Adapted for the Triton server ({self.server.describe()}){why}:\n{adaptation}"

    def write_config(self, config_file: Path | str, typed: str) -> Path:
        """Write `typed`, config.pbtxt text as a student types it (an `instance_group [ ... ]`, a
        `dynamic_batching { ... }` block), into `config_file`, a model's config.pbtxt in the
        repository this Triton reads (`lab.repository / model / "config.pbtxt"`): each field typed
        replaces that field of the file, or is added; the file's other lines stay. Checked against
        Triton's schema and adapted to the server first, as `apply_config` does (without a GPU,
        KIND_CPU for KIND_GPU, said with the diff); then the file is printed as Triton will read it.
        Triton reads it when the model is next loaded (`load_model`, Triton's model-control API),
        which is the notebook's to call. Text it will not write (a misspelt field, a value out of
        range, another model's name) is a TypedConfigError that says what to change, the file
        left as it was. Returns the file."""
        config_file = Path(config_file)
        model = config_file.parent.name
        if self.repository is None:
            raise RuntimeError("This notebook connected without Triton (Lab.connect(triton=False)).")
        expected = self.repository / model / "config.pbtxt"
        if model not in self.models.names() or config_file.resolve() != expected.resolve():
            raise TypedConfigError(
                f"{config_file} is not a file this Triton reads: each model's is lab.repository / MODEL / "
                f'"config.pbtxt", in {self.repository}, for {listed(self.models.names())}.'
            )
        current = TritonConfig.read(config_file, f"{model}/config.pbtxt")
        try:
            edited = current.with_text(typed)
            if edited.name not in ("", model):
                raise ConfigError(
                    f'{model}/config.pbtxt: the text says name: "{edited.name}"; this file is {model}\'s.'
                )
            served = triton_local.served_config(self.models.get(model), edited, config_file.parent, self.server)
        except (ConfigError, triton_local.StagingError) as wrong:
            raise TypedConfigError(f"{wrong}\nNothing was written: {config_file} is as it was.") from None
        if adaptation := self._adaptation(edited, served, f"{model}/config.pbtxt as typed"):
            print(adaptation)
        config_file.write_text(served.text)
        print(f"{config_file}, as Triton reads it at the next load of {model}:\n\n{served.text}")
        return config_file

    def version(self, http: str | None = None) -> tuple[int, ...]:
        """The release of the Triton at `http` (default: the lab's), as it reports it: (2, 51, 0)."""
        version = triton_http.InferenceServerClient(http or self.address).get_server_metadata()["version"]
        return tuple(int(part) for part in version.split("."))

    def log_verbosity(self, level: int, http: str | None = None) -> None:
        """Set the verbose log level of the Triton at `http` (default: the lab's) through its
        logging API: 1 logs every step of every request; 0 (where a server starts) turns it off."""
        triton_http.InferenceServerClient(http or self.address).update_log_settings({"log_verbose_level": level})

    def restore_config(self, model: str) -> int:
        """Back to the config as shipped; how many instances Triton now serves (see `apply_config`)."""
        return self.apply_config(model, self.config(model))

    def left_edited(self) -> dict[str, str]:
        """The models whose served config is not the one as shipped (a notebook before left an edit
        in place: notebook 6's eight instances), each with what differs: its file in the repository,
        or what Triton reports it runs (its instances, dynamic batching)."""
        if self.repository is None:
            return {}
        client = triton_http.InferenceServerClient(self.address)
        ready = {entry["name"] for entry in client.get_model_repository_index() if entry.get("state") == "READY"}
        edited = {}
        for model in self.models:
            staged = self.repository / model.name / "config.pbtxt"
            if model.name not in ready or not staged.is_file():
                continue  # not served: nothing of it to measure, nor to put back
            shipped = triton_local.served_config(model, model.config, staged.parent, self.server)
            expected = (self._instances(shipped), shipped.proto.HasField("dynamic_batching"))
            served = (self.served_instances(model.name), "dynamic_batching" in self.served_config(model.name))
            said = f"Triton serves {served[0]} instance(s){', dynamic batching' if served[1] else ''}"
            if staged.read_text() != shipped.text:
                edited[model.name] = f"its config.pbtxt is an edit ({said})"
            elif served != expected:
                edited[model.name] = said
        return edited

    def _instances(self, config: TritonConfig) -> int:
        """How many instances Triton runs for `config`: `count` on each GPU a group lists, or on each
        of the server's GPUs where a GPU group lists none."""
        gpu = model_config_pb2.ModelInstanceGroup.KIND_GPU
        return sum(
            group.count * (len(group.gpus) or (self.server.gpus if group.kind == gpu else 1) or 1)
            for group in config.proto.instance_group
        )

    def restore_shipped_configs(self) -> list[str]:
        """Put every model Triton serves with an edit (`left_edited`) back to its config as shipped,
        saying so; the models put back. Lab.connect calls it, so that a notebook's first runs
        measure the models as shipped whatever an earlier notebook left."""
        edited = self.left_edited()
        for model, what in edited.items():
            print(f"{model}: {what}, left by an earlier notebook; back to the config as shipped.")
            self.restore_config(model)
        return list(edited)
