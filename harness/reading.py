"""Files read with bounds: every JSON and YAML document (whole), JSON-lines file and log (a line at a time, or its
tail) the harness reads, refused with a HarnessError naming the file and where past a bound or malformed.
harness.io re-exports each, so `from harness.io import read_json_object` keeps working."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from harness import HarnessError

# Bounds on every JSON and YAML document the harness reads (configs, claims, manifests, plans, records, baselines)
# and on every line of a log or JSON-lines file: the harness's own files are far inside them, so a file past one is
# damage or an attack, refused before it can take the machine's memory or Python's stack.
MAX_DOCUMENT_BYTES = 16 << 20
MAX_DEPTH = 64  # nesting of mappings and lists; the harness's own files nest fewer than 10 deep
MAX_LINE_BYTES = 16 << 20  # a log line; verl's validation generations put a whole step's samples on one line


def _no_constant(name: str) -> object:
    raise ValueError(f"{name} is not a number JSON allows")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is not a finite number")
    return value


def strict_json(text: str | bytes) -> object:
    """json.loads without NaN and Infinity (nor 1e999, which json reads as infinity): a value the harness never
    writes (write_json refuses them), so one in a file is damage, and would otherwise pass every comparison
    silently. ValueError for anything else it cannot read, nesting too deep for Python's stack included."""
    try:
        return json.loads(text, parse_constant=_no_constant, parse_float=_finite_float)
    except RecursionError:
        raise ValueError("nested too deep to read") from None


class _NoAliasLoader(yaml.SafeLoader):
    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.events.AliasEvent):
            mark = self.peek_event().start_mark
            raise ValueError(f"line {mark.line + 1}: a YAML alias (*name); write the block out, aliases are not "
                             "accepted (nested aliases of a few hundred bytes expand to gigabytes)")
        return super().compose_node(parent, index)


def bounded_tree(value: object, source: str) -> object:
    """`value` (parsed JSON or YAML) back, or HarnessError naming `source` and where: nested deeper than MAX_DEPTH,
    a number that is not finite (YAML's .nan and .inf) or an integer past 64 bits (numpy, torch and parquet take
    no more)."""
    stack: list[tuple[object, str, int]] = [(value, "(top level)", 0)]
    while stack:
        node, where, depth = stack.pop()
        if isinstance(node, float) and not math.isfinite(node):
            raise HarnessError(f"{source}: at {where}: {node} is not a finite number")
        if isinstance(node, int) and not -(1 << 63) <= node < 1 << 63:
            raise HarnessError(f"{source}: at {where}: {node} does not fit in 64 bits")
        if not isinstance(node, (dict, list)):
            continue
        if depth >= MAX_DEPTH:
            raise HarnessError(f"{source}: at {where}: nested more than {MAX_DEPTH} deep")
        items = node.items() if isinstance(node, dict) else enumerate(node)
        stack.extend((child, str(key) if where == "(top level)" else f"{where}.{key}", depth + 1)
                     for key, child in items)
    return value


def _parse(data: str | bytes, yaml_syntax: bool) -> object:
    """ValueError with the reason for anything that cannot be read."""
    try:
        text = data.decode() if isinstance(data, bytes) else data
        return yaml.load(text, Loader=_NoAliasLoader) if yaml_syntax else strict_json(text)
    except RecursionError:
        raise ValueError("nested too deep to read") from None
    except yaml.YAMLError as e:
        raise ValueError(str(e)) from None


def parse_document(data: str | bytes, source: str, *, yaml_syntax: bool) -> object:
    """The one parser of a whole JSON or YAML document: NaN, Infinity, YAML aliases and deep nesting refused with a
    HarnessError naming `source`."""
    try:
        value = _parse(data, yaml_syntax)
    except ValueError as e:  # JSON's errors, NaN, an alias, bytes that are not UTF-8
        raise HarnessError(f"{source}: not valid {'YAML' if yaml_syntax else 'JSON'}: {getattr(e, 'msg', e)}") \
            from None
    return bounded_tree(value, source)


def read_capped(path: Path, what: str, missing_hint: str, max_bytes: int) -> bytes:
    """The bytes of `path`, or HarnessError past `max_bytes`; read in chunks, since read(n) allocates n at once."""
    chunks: list[bytes] = []
    total = 0
    try:
        with open(path, "rb") as f:
            while total <= max_bytes and (chunk := f.read(min(1 << 20, max_bytes + 1 - total))):
                chunks.append(chunk)
                total += len(chunk)
    except FileNotFoundError:
        raise HarnessError(f"{path}: {what} not found{missing_hint}") from None
    except IsADirectoryError:
        raise HarnessError(f"{path}: {what} should be a file, not a folder") from None
    if total > max_bytes:
        raise HarnessError(f"{path}: larger than {max_bytes} bytes; not a {what}")
    return b"".join(chunks)


def read_document(path: str | os.PathLike, what: str, missing_hint: str = "",
                  max_bytes: int = MAX_DOCUMENT_BYTES) -> object:
    """The JSON (a .json file) or YAML document in `path`, read through parse_document, at most `max_bytes`."""
    path = Path(path)
    data = read_capped(path, what, missing_hint, max_bytes)
    return parse_document(data, str(path), yaml_syntax=path.suffix != ".json")


def read_json_object(path: str | os.PathLike, what: str, missing_hint: str = "") -> dict:
    """The JSON object in `path`; HarnessError naming the file and what it should have been otherwise."""
    path = Path(path)
    data = read_capped(path, what, missing_hint, MAX_DOCUMENT_BYTES)
    try:
        value = bounded_tree(_parse(data, yaml_syntax=False), str(path))
    except ValueError as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise HarnessError(f"{path}: {what} is not valid JSON ({e})") from None
    if not isinstance(value, dict):
        raise HarnessError(f"{path}: {what} should be a JSON object, not {type(value).__name__}")
    return value


def text_lines(path: str | os.PathLike, errors: str = "strict") -> Iterator[tuple[int, str]]:
    """(line number, line) of a text file (a log), each line at most MAX_LINE_BYTES: a longer one stops it, naming
    the file and the line, before it is held in memory whole. Bytes that are not UTF-8 stop it too, naming the line,
    unless `errors` says otherwise ("replace", for a framework's console, where a killed process may cut a character
    in two). A carriage return ends a line, as in Python's text mode: a progress bar redraws itself with them."""
    lineno = 0
    with open(path, "rb") as f:
        while raw := f.readline(MAX_LINE_BYTES + 1):
            if len(raw) > MAX_LINE_BYTES:
                raise HarnessError(f"{path}:{lineno + 1}: a line longer than {MAX_LINE_BYTES} bytes; not a line "
                                   "the harness reads")
            try:
                text = raw.decode("utf-8", errors)
            except UnicodeDecodeError as e:
                raise HarnessError(f"{path}:{lineno + 1}: not UTF-8 text ({e.reason} at byte {e.start} of the "
                                   "line)") from None
            *ended, rest = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
            for line in [*(part + "\n" for part in ended), *([rest] if rest else [])]:
                lineno += 1
                yield lineno, line


# What of a log is read for a failed run's cause and tail: a long run's console can be gigabytes, and what names why
# it stopped (Ray's death notices, the last traceback) comes at its end.
LOG_TAIL_BYTES = 2 << 20


def log_tail(path: str | os.PathLike) -> str:
    """The last LOG_TAIL_BYTES of a log as text, from the first whole line in them; "" where there is no log."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(0, size - LOG_TAIL_BYTES))
            data = f.read()
    except OSError:
        return ""
    if size > LOG_TAIL_BYTES:
        data = data[data.find(b"\n") + 1:]
    return data.decode(errors="replace")


def read_jsonl(path: str | os.PathLike, bad_line: str = "not valid JSON") -> Iterator[tuple[int, object]]:
    """(line number, value) of each line of a JSON-lines file; a line that is not JSON stops it, naming the file and
    the line (`bad_line` says what the line should have been). The caller checks each value's shape."""
    for lineno, line in text_lines(path):
        try:
            value = _parse(line, yaml_syntax=False)
        except ValueError as e:
            raise HarnessError(f"{path}:{lineno}: {bad_line} ({getattr(e, 'msg', e)})") from None
        yield lineno, bounded_tree(value, f"{path}:{lineno}")
