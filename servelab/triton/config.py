"""Triton model configurations (`config.pbtxt`): read, edit, validate, diff, keeping their text.

A `TritonConfig` is the text of one `config.pbtxt` plus what it means. Every edit goes through
Triton's own schema (`model_config.proto`, shipped in tritonclient), so a misspelt field or a
wrong value fails here, in the notebook, with the line it is on, and not later in Triton's log.

Edits keep the text a student reads: only the fields an edit changes are rewritten, and inside
a changed block only the lines that differ, so the shipped comments stay and a diff shows just
the edit. Changed fields are written in the style of the shipped configs (`[ ]` lists); the text's
machinery is servelab.triton.config_text's.

    config = TritonConfig.read(Path("models_staging/food_classifier/config.pbtxt"))
    edited = config.with_dynamic_batching(preferred_batch_size=[4, 8], max_queue_delay_microseconds=100)
    typed = config.with_text("dynamic_batching { preferred_batch_size: [ 4, 8 ] }")  # the same, typed
    print(config.diff(edited))

What a given server makes of a config (its GPUs, its backends) is servelab.triton.adaptation's.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeAlias

from google.protobuf import descriptor_pool, json_format, text_format
from google.protobuf.message import Message
from tritonclient.grpc import model_config_pb2

from servelab.triton.config_text import ConfigError, rewrite

ModelConfig = model_config_pb2.ModelConfig
# A parsed config, a ModelConfig message: tritonclient's generated classes carry no types, so its
# fields are not checked (servelab.triton.config_text's generic protobuf code takes any Message).
ModelConfigProto: TypeAlias = Any


# ---- the config ------------------------------------------------------------------------------


def _parse(text: str, origin: str) -> ModelConfigProto:
    config = ModelConfig()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as exc:
        raise ConfigError(
            f"{origin}: {exc}. Fix that line (Triton's schema: model_config.proto, "
            "https://github.com/triton-inference-server/common/blob/main/protobuf/model_config.proto)."
        ) from None
    return config


def _check_semantics(config: ModelConfigProto, origin: str) -> None:
    """What Triton 2.51 refuses at load time with a message that does not say why ("failed to poll
    from model repository"), or accepts while doing something else, said here instead."""
    problems = []
    for size in config.dynamic_batching.preferred_batch_size:
        if not 0 < size <= config.max_batch_size:
            problems.append(
                f"preferred_batch_size {size} must be between 1 and max_batch_size ({config.max_batch_size})"
            )
    for group in config.instance_group:
        if group.count < 0:
            problems.append(f"instance_group count {group.count} is negative (Triton would quietly run 1 instance)")
        if group.kind == model_config_pb2.ModelInstanceGroup.KIND_CPU and group.gpus:
            problems.append("a KIND_CPU instance_group cannot list gpus")
    if problems:
        raise ConfigError(f"{origin}: " + "; ".join(problems) + ".")


_UNKNOWN_FIELD = re.compile(r'Message type "([\w.]+)" has no field named "(\w+)"')
_UNKNOWN_VALUE = re.compile(r'Enum type "([\w.]+)" has no value named (\w+)')


def _called(full_name: str) -> str:
    """A message type of the schema as config.pbtxt calls it: "an instance_group" for
    inference.ModelInstanceGroup, "a model config" for the whole config."""
    if full_name == ModelConfig.DESCRIPTOR.full_name:
        return "a model config"
    for field in ModelConfig.DESCRIPTOR.fields:
        if field.message_type is not None and field.message_type.full_name == full_name:
            return f"{'an' if field.name[0] in 'aeiou' else 'a'} {field.name}"
    return full_name.split(".")[-1]


def _typed_error(exc: text_format.ParseError, origin: str) -> str:
    """What is wrong with typed config text, in words: an unknown field or value named, with the
    one meant where one is close, else those there are; any other error as the schema says it."""
    where = f"{origin}, line {exc.GetLine()}" if exc.GetLine() else origin
    if found := _UNKNOWN_FIELD.search(str(exc)):
        message_type, name = found.groups()
        try:
            known = sorted(descriptor_pool.Default().FindMessageTypeByName(message_type).fields_by_name)
        except KeyError:
            known = []
        said = f"{_called(message_type)} has no field {name!r}"
    elif found := _UNKNOWN_VALUE.search(str(exc)):
        enum_type, name = found.groups()
        try:
            known = list(descriptor_pool.Default().FindEnumTypeByName(enum_type).values_by_name)
        except KeyError:
            known = []
        parent, _, enum = enum_type.rpartition(".")
        said = f"{_called(parent)}'s {enum.lower()} has no value {name!r}"
    else:
        return f"{where}: {str(exc).split(' : ', 1)[-1]} (Triton's schema: model_config.proto)."
    close = difflib.get_close_matches(name, known, n=1)
    hint = f"did you mean {close[0]!r}?" if close else f"it has: {', '.join(known)}."
    return f"{where}: {said}; {hint}"


@dataclass(frozen=True)
class TritonConfig:
    """The text of one config.pbtxt, checked against Triton's schema when made."""

    text: str
    origin: str = "config.pbtxt"

    def __post_init__(self) -> None:
        _check_semantics(self.proto, self.origin)

    @classmethod
    def read(cls, path: Path, origin: str | None = None) -> TritonConfig:
        return cls(Path(path).read_text(), origin or str(path))

    def __str__(self) -> str:
        return self.text

    @property
    def proto(self) -> ModelConfigProto:
        """A fresh parsed copy (a ModelConfig message): change it freely, then `with_proto` it back."""
        return _parse(self.text, self.origin)

    @property
    def name(self) -> str:
        return self.proto.name

    def with_proto(self, edited: Message) -> TritonConfig:
        """This config changed to `edited`, rewriting only the text of the fields that differ."""
        text = rewrite(self.text, self.proto, edited, "")
        result = TritonConfig(text, self.origin)
        if result.proto != edited:  # the rewrite must mean exactly the edit
            raise AssertionError(f"{self.origin}: rewriting the text did not reproduce the edit:\n{text}")
        return result

    def edit(self, change: Callable[[ModelConfigProto], None]) -> TritonConfig:
        """This config after `change(config)` has modified a parsed copy in place."""
        edited = self.proto
        change(edited)
        return self.with_proto(edited)

    def with_fields(self, **fields: Any) -> TritonConfig:
        """Set top-level fields from plain values, as written in config.pbtxt: e.g.
        `with_fields(max_batch_size=8, dynamic_batching={"max_queue_delay_microseconds": 100})`.
        A field given replaces the whole field; unknown names and bad values are refused."""
        edited = self.proto
        for name, value in fields.items():
            if name not in edited.DESCRIPTOR.fields_by_name:
                known = ", ".join(sorted(edited.DESCRIPTOR.fields_by_name))
                raise ConfigError(f"{self.origin}: a model config has no field {name!r}; its fields are: {known}.")
            edited.ClearField(name)
            try:
                json_format.ParseDict({name: value}, edited, ignore_unknown_fields=False)
            except json_format.ParseError as exc:
                raise ConfigError(f"{self.origin}: cannot set {name} to {value!r}: {exc}") from None
        return self.with_proto(edited)

    def with_text(self, block: str) -> TritonConfig:
        """This config with the top-level fields written in `block`, config.pbtxt text as typed
        (e.g. `instance_group [ { count: 2, kind: KIND_GPU } ]`, or a `dynamic_batching { ... }`
        block), each replacing that whole field, or added where this config has none; every other
        field keeps its text. Checked against Triton's schema: a misspelt or unknown field is a
        ConfigError that names it (and the field meant, where one is close)."""
        typed = ModelConfig()
        origin = f"{self.origin} (the typed text)"
        try:
            text_format.Parse(block, typed)
        except text_format.ParseError as exc:
            raise ConfigError(_typed_error(exc, origin)) from None
        written = [field.name for field, _ in typed.ListFields()]
        if not written:
            raise ConfigError(f"{origin}: the text writes no field (e.g. instance_group [ {{ count: 2 }} ]).")
        edited = self.proto
        for name in written:
            edited.ClearField(name)
        edited.MergeFrom(typed)
        return self.with_proto(edited)

    def without(self, *names: str) -> TritonConfig:
        """This config with the named top-level fields removed (e.g. "dynamic_batching")."""

        def clear(config: ModelConfigProto) -> None:
            for name in names:
                config.ClearField(name)

        return self.edit(clear)

    def with_instance_groups(self, groups: list[Mapping[str, Any]]) -> TritonConfig:
        """Replace instance_group, e.g. `[{"count": 2, "kind": "KIND_GPU", "gpus": [0, 1]}]` (for a GPU
        group, `count` instances run on each GPU listed)."""
        return self.with_fields(instance_group=list(groups))

    def with_dynamic_batching(self, **settings: Any) -> TritonConfig:
        """Turn dynamic batching on with these settings, e.g. `preferred_batch_size=[4, 8],
        max_queue_delay_microseconds=100, default_queue_policy={"max_queue_size": 8}`."""
        return self.with_fields(dynamic_batching=settings)

    def with_sequence_batching(self, **settings: Any) -> TritonConfig:
        """Set the sequence batcher, e.g. `max_sequence_idle_microseconds=5_000_000, oldest={}`."""
        return self.with_fields(sequence_batching=settings)

    def with_sequence_strategy(self, strategy: str, **settings: Any) -> TritonConfig:
        """The sequence batcher switched to `strategy` ("direct" or "oldest") with these settings
        (e.g. `max_queue_delay_microseconds=2000`), keeping its control inputs and idle limit."""
        if strategy not in ("direct", "oldest"):
            raise ConfigError(
                f"{self.origin}: the sequence batcher's strategies are 'direct' and 'oldest', not {strategy!r}."
            )
        if not self.proto.HasField("sequence_batching"):
            raise ConfigError(f"{self.origin}: this model has no sequence_batching to change (it is not stateful).")

        def change(config: ModelConfigProto) -> None:
            config.sequence_batching.ClearField("direct")
            config.sequence_batching.ClearField("oldest")
            chosen = getattr(config.sequence_batching, strategy)
            chosen.SetInParent()
            try:
                json_format.ParseDict(settings, chosen, ignore_unknown_fields=False)
            except json_format.ParseError as exc:
                raise ConfigError(f"{self.origin}: cannot set the {strategy} strategy to {settings!r}: {exc}") from None

        return self.edit(change)

    def with_parameters(self, **parameters: str) -> TritonConfig:
        """Add (or change) string `parameters`, which Triton reports in the model's config."""

        def change(config: ModelConfigProto) -> None:
            for key, value in parameters.items():
                config.parameters[key].string_value = value

        return self.edit(change)

    def instance_count(self) -> int:
        """How many instances this config runs: a GPU group's count is per listed GPU."""
        return sum(group.count * max(1, len(group.gpus)) for group in self.proto.instance_group)

    def diff(self, other: TritonConfig, before: str | None = None, after: str | None = None) -> str:
        """The unified diff from this config to `other` ("" when they are the same text)."""
        return "".join(
            difflib.unified_diff(
                self.text.splitlines(keepends=True),
                other.text.splitlines(keepends=True),
                before or self.origin,
                after or other.origin,
            )
        )
