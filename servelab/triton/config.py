"""Triton model configurations (`config.pbtxt`): read, edit, validate, diff, keeping their text.

A `TritonConfig` is the text of one `config.pbtxt` plus what it means. Every edit goes through
Triton's own schema (`model_config.proto`, shipped in tritonclient), so a misspelt field or a
wrong value fails here, in the notebook, with the line it is on, and not later in Triton's log.

Edits keep the text a student reads: only the fields an edit changes are rewritten, and inside
a changed block only the lines that differ, so the shipped comments stay and a diff shows just
the edit. Changed fields are written in the style of the shipped configs (`[ ]` lists).

    config = TritonConfig.read(Path("models_staging/food_classifier/config.pbtxt"))
    edited = config.with_dynamic_batching(preferred_batch_size=[4, 8], max_queue_delay_microseconds=100)
    typed = config.with_text("dynamic_batching { preferred_batch_size: [ 4, 8 ] }")  # the same, typed
    print(config.diff(edited))

What a given server makes of a config (its GPUs, its backends) is servelab.triton.adaptation's.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeAlias

from google.protobuf import descriptor_pool, json_format, text_format
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from google.protobuf.text_encoding import CEscape
from tritonclient.grpc import model_config_pb2

ModelConfig = model_config_pb2.ModelConfig
# A parsed config, a ModelConfig message: tritonclient's generated classes carry no types, so its
# fields are not checked (the generic protobuf code below takes any Message).
ModelConfigProto: TypeAlias = Any
INDENT = "  "


class ConfigError(ValueError):
    """A config that Triton would refuse; the message names the config, the line and the fix."""


# ---- reading the text: where each field is -------------------------------------------------


@dataclass(frozen=True)
class _Field:
    """One field in a message body: `name: value`, `name { ... }` or `name [ ... ]`."""

    name: str
    start: int  # where the name begins
    end: int  # just after the value (and a trailing ',' or ';')
    body: tuple[int, int] | None  # inside `{ }` for a message value, else None


_CLOSING = {"{": "}", "[": "]", "<": ">"}


def _skip_space(text: str, i: int, end: int) -> int:
    """Past whitespace and `#` comments."""
    while i < end:
        if text[i].isspace():
            i += 1
        elif text[i] == "#":
            newline = text.find("\n", i, end)
            i = end if newline < 0 else newline + 1
        else:
            break
    return i


def _skip_string(text: str, i: int) -> int:
    quote, i = text[i], i + 1
    while i < len(text) and text[i] != quote:
        i += 2 if text[i] == "\\" else 1
    return i + 1


def _skip_balanced(text: str, i: int) -> int:
    """From an opening bracket, to just past the one that closes it (strings and comments skipped)."""
    stack = [_CLOSING[text[i]]]
    i += 1
    while stack:
        if i >= len(text):
            raise ConfigError("a bracket is never closed")
        char = text[i]
        if char in "\"'":
            i = _skip_string(text, i)
            continue
        if char == "#":
            i = _skip_space(text, i, len(text))
            continue
        if char in _CLOSING:
            stack.append(_CLOSING[char])
        elif char == stack[-1]:
            stack.pop()
        i += 1
    return i


def _fields(text: str, start: int, end: int) -> list[_Field]:
    """The fields of the message body text[start:end], in order."""
    found: list[_Field] = []
    i = start
    while True:
        i = _skip_space(text, i, end)
        while i < end and text[i] in ",;":
            i = _skip_space(text, i + 1, end)
        if i >= end:
            return found
        name_start = i
        while i < end and (text[i].isalnum() or text[i] in "_."):
            i += 1
        if i == name_start:
            raise ConfigError(f"unexpected {text[i]!r}")
        name = text[name_start:i]
        i = _skip_space(text, i, end)
        if i < end and text[i] == ":":
            i = _skip_space(text, i + 1, end)
        body = None
        if i < end and text[i] in _CLOSING:
            close = _skip_balanced(text, i)
            if text[i] != "[":
                body = (i + 1, close - 1)
            i = close
        elif i < end and text[i] in "\"'":  # one string, or several adjacent ones
            i = _skip_string(text, i)
            while (after := _skip_space(text, i, end)) < end and text[after] in "\"'":
                i = _skip_string(text, after)
        else:  # one word: a number, an enum value, true or false
            while i < end and not text[i].isspace() and text[i] not in ",;#}]>":
                i += 1
        if i < end and text[i] in ",;":
            i += 1
        found.append(_Field(name, name_start, i, body))


# ---- writing fields in the style of the shipped configs --------------------------------------


def _scalar(field: FieldDescriptor, value: Any) -> str:
    if field.type == FieldDescriptor.TYPE_ENUM:
        return field.enum_type.values_by_number[value].name
    if field.type in (FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_BYTES):
        raw = value.encode() if isinstance(value, str) else value
        return '"' + CEscape(raw, as_utf8=True) + '"'
    if field.type == FieldDescriptor.TYPE_BOOL:
        return "true" if value else "false"
    return repr(value) if isinstance(value, float) else str(value)


def _is_map(field: FieldDescriptor) -> bool:
    return field.message_type is not None and field.message_type.GetOptions().map_entry


def _message_lines(message: Message, indent: str, order: Sequence[str] = ()) -> list[str]:
    """The fields of `message`; those named in `order` first, in that order (to match a neighbour)."""
    rank = {name: position for position, name in enumerate(order)}
    fields = sorted(message.ListFields(), key=lambda item: rank.get(item[0].name, len(rank) + item[0].index))
    lines = []
    for field, value in fields:
        lines += _field_lines(field, value, indent)
    return lines


def _inline_message(message: Message) -> str | None:
    """`{ string_value: "x" }` for a message of one scalar field, as the shipped parameters are written."""
    fields = message.ListFields()
    if len(fields) == 1 and fields[0][0].message_type is None and fields[0][0].label != FieldDescriptor.LABEL_REPEATED:
        return f"{{ {fields[0][0].name}: {_scalar(fields[0][0], fields[0][1])} }}"
    return None


def _block(opening: str, message: Message, indent: str, order: Sequence[str] = ()) -> list[str]:
    return [f"{indent}{opening}{{", *_message_lines(message, indent + INDENT, order), f"{indent}}}"]


def _field_lines(field: FieldDescriptor, value: Any, indent: str) -> list[str]:
    """The lines that write one field (all its values), at `indent`."""
    if _is_map(field):
        key_field, value_field = field.message_type.fields_by_name["key"], field.message_type.fields_by_name["value"]
        lines = []
        for key in sorted(value):
            entry = value[key]
            lines += [f"{indent}{field.name} {{", f"{indent}{INDENT}key: {_scalar(key_field, key)}"]
            if value_field.message_type is None:
                lines.append(f"{indent}{INDENT}value: {_scalar(value_field, entry)}")
            elif (inline := _inline_message(entry)) is not None:
                lines.append(f"{indent}{INDENT}value: {inline}")
            else:
                lines += _block("value ", entry, indent + INDENT)
            lines.append(f"{indent}}}")
        return lines
    if field.label == FieldDescriptor.LABEL_REPEATED:
        if field.message_type is None:
            return [f"{indent}{field.name}: [ {', '.join(_scalar(field, item) for item in value)} ]"]
        lines = [f"{indent}{field.name} ["]
        for position, item in enumerate(value):
            block = _block("", item, indent + INDENT)
            if position < len(value) - 1:
                block[-1] += ","
            lines += block
        return [*lines, f"{indent}]"]
    if field.message_type is not None:
        return _block(f"{field.name} ", value, indent)
    return [f"{indent}{field.name}: {_scalar(field, value)}"]


# ---- rewriting only what changed ------------------------------------------------------------


def _has(message: Message, field: FieldDescriptor) -> bool:
    if field.label == FieldDescriptor.LABEL_REPEATED:
        return len(getattr(message, field.name)) > 0
    # has_presence: protobuf has it since 4.22, types-protobuf 4.25's stubs leave it out.
    has_presence = field.has_presence  # type: ignore[attr-defined]
    return message.HasField(field.name) if has_presence else getattr(message, field.name) != field.default_value


def _line_bounds(text: str, start: int, end: int) -> tuple[int, int, bool]:
    """Widen [start, end) to whole lines when nothing else shares them; the flag says if it did."""
    line_start = text.rfind("\n", 0, start) + 1
    line_end = text.find("\n", end)
    line_end = len(text) if line_end < 0 else line_end + 1
    if text[line_start:start].strip() == "" and text[end:line_end].strip() == "":
        return line_start, line_end, True
    return start, end, False


def _list_items(text: str, start: int, end: int) -> list[tuple[int, int]]:
    """The `{ ... }` items of the list text[start:end] (inside its brackets)."""
    items, i = [], start
    while (i := _skip_space(text, i, end)) < end:
        if text[i] in "{<":
            close = _skip_balanced(text, i)
            items.append((i, close))
            i = close
        else:
            i += 1  # a comma
    return items


def _rewrite_list(text: str, span: _Field, field: FieldDescriptor, before: Any, after: Any, indent: str) -> str:
    """A list of messages rewritten item by item: unchanged items verbatim, changed ones edited in
    place, new ones written with their fields in the order the list's last item uses."""
    open_at = text.index("[", span.start)
    old_items = _list_items(text, open_at + 1, span.end - 1)
    item_indent = indent + INDENT
    order = [found.name for found in _fields(text, old_items[-1][0] + 1, old_items[-1][1] - 1)] if old_items else []
    written = []
    for position, item in enumerate(after):
        if position < len(old_items):
            item_start, item_end = old_items[position]
            body = text[item_start + 1 : item_end - 1]
            if before[position] == item or "\n" in body:
                written.append("{" + _rewrite(body, before[position], item, item_indent + INDENT) + "}")
                continue
        written.append("\n".join(_block("", item, item_indent, order)).strip())
    return f"{field.name} [\n{item_indent}" + f",\n{item_indent}".join(written) + f"\n{indent}]"


def _rewrite(text: str, before: Message, after: Message, indent: str) -> str:
    """`text`, the body of a message, changed from `before` to `after`; untouched fields stay verbatim."""
    present = _fields(text, 0, len(text))
    edits: list[tuple[int, int, str]] = []  # (start, end, replacement), applied from the back
    appended: list[str] = []
    for field in after.DESCRIPTOR.fields:
        old, new = getattr(before, field.name), getattr(after, field.name)
        if _has(before, field) == _has(after, field) and old == new:
            continue
        spans = [span for span in present if span.name == field.name]
        if not _has(after, field):
            edits += [(*_line_bounds(text, span.start, span.end)[:2], "") for span in spans]
            continue
        nested = field.message_type is not None and field.label != FieldDescriptor.LABEL_REPEATED
        if nested and len(spans) == 1 and spans[0].body and "\n" in text[slice(*spans[0].body)]:
            # A block written over several lines: change only what differs inside it.
            inner_start, inner_end = spans[0].body
            edits.append((inner_start, inner_end, _rewrite(text[inner_start:inner_end], old, new, indent + INDENT)))
            continue
        if not spans:
            appended += _field_lines(field, new, indent)
            continue
        first = spans[0]
        if field.message_type is not None and not _is_map(field) and len(spans) == 1 and text[first.end - 1] == "]":
            edits.append((first.start, first.end, _rewrite_list(text, first, field, old, new, indent)))
            continue
        first_start, first_end, whole_lines = _line_bounds(text, first.start, first.end)
        written = "\n".join(_field_lines(field, new, indent))
        edits.append((first_start, first_end, written + "\n" if whole_lines else written.strip()))
        edits += [(*_line_bounds(text, span.start, span.end)[:2], "") for span in spans[1:]]
    if appended:
        # New fields go at the end: on the closing brace's line (before the brace), or after the last line.
        line_start = text.rfind("\n") + 1
        at = line_start if line_start > 0 and text[line_start:].strip() == "" else len(text)
        prefix = "" if at == 0 or text[at - 1] == "\n" else "\n"
        edits.append((at, at, prefix + "\n".join(appended) + "\n"))
    for edit_start, edit_end, replacement in sorted(edits, reverse=True):
        text = text[:edit_start] + replacement + text[edit_end:]
    return text


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
        text = _rewrite(self.text, self.proto, edited, "")
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
