"""The text of a `config.pbtxt`, as servelab.triton.config's `TritonConfig` keeps it through an
edit: where each field is in the text, a field written in the style of the shipped configs (`[ ]`
lists, one field a line), and `rewrite`, which rewrites only the fields an edit changed (inside a
changed block, only the lines that differ), so the shipped comments stay and a diff shows just the
edit. It reads protobuf messages generically (any Message), and knows no Triton field by name.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from google.protobuf.text_encoding import CEscape

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
                written.append("{" + rewrite(body, before[position], item, item_indent + INDENT) + "}")
                continue
        written.append("\n".join(_block("", item, item_indent, order)).strip())
    return f"{field.name} [\n{item_indent}" + f",\n{item_indent}".join(written) + f"\n{indent}]"


def rewrite(text: str, before: Message, after: Message, indent: str) -> str:
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
            edits.append((inner_start, inner_end, rewrite(text[inner_start:inner_end], old, new, indent + INDENT)))
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
