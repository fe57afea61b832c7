"""The shapes of the JSON records that outlive the run that wrote them and are read back by later stages: a run's
manifest (harness.runtime.manifest), a history row, a baseline. The JSON readers refuse what is not JSON, and NaN
and Infinity; a field of the wrong type is refused here, naming the file and the field, before any stage computes
with it (a string where the hardware record should be, a step that is text, a number too large for an int64 column).

A shape maps a field's path (dots between keys, `*` for every key of an object or item of a list) to its kind; a
field the record lacks is refused only where the reader requires it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator
from pathlib import Path

from harness import HarnessError
from harness.io import read_json_object

Kind = tuple[str, Callable[[object], bool]]

INT64 = 2**63  # an integer the per-step schema, numpy and the JSON writers all hold exactly


def _integer(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and -INT64 <= value < INT64


def _number(value: object) -> bool:
    # A JSON number past float's range (1e400) parses as infinity without the word Infinity.
    return (isinstance(value, float) and math.isfinite(value)) or _integer(value)


TEXT: Kind = ("a string", lambda v: isinstance(v, str))
OBJECT: Kind = ("an object", lambda v: isinstance(v, dict))
LIST: Kind = ("a list", lambda v: isinstance(v, list))
INTEGER: Kind = ("an integer", _integer)
NUMBER: Kind = ("a finite number", _number)


# A commit as `git rev-parse HEAD` prints it (SHA-1, or the SHA-256 object format): a record's commit is later given
# to git (reproduce's diff, an A/B's arm), where anything else could be read as an option, a range or a path.
COMMIT_ID = re.compile(r"[0-9a-f]{40}(?:[0-9a-f]{24})?")
COMMIT: Kind = ("a full hex commit id", lambda v: isinstance(v, str) and COMMIT_ID.fullmatch(v) is not None)


def or_null(kind: Kind) -> Kind:
    return f"{kind[0]} or null", lambda v: v is None or kind[1](v)


MANIFEST: dict[str, Kind] = {
    "framework": TEXT, "framework_version": TEXT, "run_id": TEXT, "seed": INTEGER, "profile": TEXT,
    "config_hash": TEXT, "config": OBJECT, "created": TEXT,
    "inputs": OBJECT, "inputs.*": OBJECT, "inputs.*.path": TEXT, "inputs.*.sha256": or_null(TEXT),
    "versions": OBJECT, "versions.*": or_null(TEXT),
    "hardware": OBJECT, "hardware.cpu": or_null(TEXT), "hardware.cpu_count": or_null(INTEGER),
    "hardware.machine": or_null(TEXT), "hardware.gpus": LIST, "hardware.gpus.*": TEXT,
    "git": OBJECT, "git.commit": or_null(COMMIT),
    "environment": or_null(OBJECT), "environment.name": or_null(TEXT), "environment.packages": or_null(LIST),
    "environment.packages.*": TEXT,
}


def _type_name(value: object) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), f"the number {value!r:.40}" if isinstance(value, (int, float)) else type(value).__name__)


def _at(node: object, parts: list[str], where: str) -> Iterator[tuple[str, object]]:
    """(path, value) of every field `parts` names under `node`."""
    if not parts:
        yield where, node
        return
    head, rest = parts[0], parts[1:]
    if head != "*":
        found = [(head, node[head])] if isinstance(node, dict) and head in node else []
    elif isinstance(node, dict):
        found = list(node.items())
    else:
        found = [(f"[{i}]", v) for i, v in enumerate(node)] if isinstance(node, list) else []
    for key, value in found:
        path = f"{where}{key}" if key.startswith("[") else f"{where}.{key}" if where else key
        yield from _at(value, rest, path)


def _missing(record: dict, field: str) -> str | None:
    """The path of the first place `field` is absent (its holder present: a holder of the wrong type is named by
    the shape)."""
    holder, _, key = field.rpartition(".")
    for where, node in _at(record, holder.split("."), "") if holder else [("", record)]:
        if isinstance(node, dict) and key not in node:
            return f"{where}.{key}" if where else key
    return None


def check_shape(record: object, shape: dict[str, Kind], where: str | Path, required: tuple[str, ...] = (),
                what: str = "record") -> dict:
    """`record`, which must be an object holding every field of `shape` it has of its kind, and the `required`
    fields; HarnessError naming `where` (the file, or file:line) and the field otherwise. A field is checked after
    the one that holds it, so a message names the outermost field that is wrong."""
    if not isinstance(record, dict):
        raise HarnessError(f"{where}: {what} should be a JSON object, not {_type_name(record)}")
    for field, (expected, ok) in shape.items():
        holder, _, last = field.rpartition(".")
        # Every item of a list or object (a history row's curve: 150 numbers): checked at once, its path named
        # only for an item that is wrong (a path per item made reading a year of history take seconds).
        nodes = (_at(record, holder.split("."), "") if holder else [("", record)]) if last == "*" else ()
        for at, node in nodes:
            items = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
            if all(ok(v) for v in items):
                continue
            for path, value in _at(node, ["*"], at):
                if not ok(value):
                    raise HarnessError(f"{where}: {path}: expected {expected}, not {_type_name(value)}")
        for path, value in _at(record, field.split("."), "") if last != "*" else ():
            if not ok(value):
                raise HarnessError(f"{where}: {path}: expected {expected}, not {_type_name(value)}")
    missing = [m for field in required if (m := _missing(record, field))]
    if missing:
        raise HarnessError(f"{where}: {what} lacks {', '.join(map(repr, missing))}")
    return record


def read_manifest(path: str | Path, required: tuple[str, ...] = ()) -> dict:
    """A run directory's manifest.json, checked against MANIFEST."""
    return check_shape(read_json_object(path, "manifest", " (the run directory has no manifest)"), MANIFEST, path,
                       required, "manifest")
