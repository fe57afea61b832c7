"""Files written whole or not at all, and the hashes that tie every run to its inputs."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import math
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from harness import HarnessError

OWNER = ".remax-bench.json"  # in every directory the harness makes: what it is (hidden: sha256_tree leaves it out)
# OWNER's key listing the files (relative paths, names only: a run folder can hold GB checkpoints) the directory held
# when the harness made it; the rest of OWNER says what the directory is.
MADE_FILES = "files"
# In every folder the harness writes a file into: {file name: sha256 of the file as written}. A file may be replaced
# only while it is exactly what the harness wrote there (hidden, like OWNER).
WRITTEN = ".remax-bench-files.json"
# Files in a harness-made folder that nobody's work is in: Snakemake's marker in a directory() output, and the
# harness's own records.
MARKERS = frozenset({".snakemake_timestamp", OWNER, WRITTEN})


def _small_json(path: Path) -> object:
    """A record of the harness's own (OWNER, WRITTEN), or None where it is missing, unreadable or too large."""
    try:
        return _parse(_read_capped(path, "record", "", MAX_DOCUMENT_BYTES), yaml_syntax=False)
    except (OSError, ValueError, HarnessError):
        return None


def _owner_of(path: Path) -> dict | None:
    mark = _small_json(path / OWNER)
    return mark if isinstance(mark, dict) else None


def _written(folder: Path) -> dict:
    data = _small_json(folder / WRITTEN)
    return data if isinstance(data, dict) else {}


def _files_in(folder: Path) -> list[str]:
    """The files (and links, never followed) under `folder`, as sorted relative POSIX paths, markers left out."""
    found = []
    for root, dirs, files in os.walk(folder):
        here = Path(root)
        links = [d for d in dirs if (here / d).is_symlink()]
        for name in (*files, *links):
            if name not in MARKERS and not name.startswith(f"{WRITTEN}."):
                found.append((here / name).relative_to(folder).as_posix())
    return sorted(found)


def _foreign_file(folder: Path, mark: dict) -> str | None:
    """A file in a harness-made folder that the harness did not put there: neither listed in its OWNER when it was
    made nor written into it since (WRITTEN) and unchanged. None for an OWNER without the list, written before the
    harness recorded one: such a folder is replaced as before, its files unchecked."""
    made = mark.get(MADE_FILES)
    if not isinstance(made, list):
        return None
    made = set(made)
    return next((name for name in _files_in(folder)
                 if name not in made and not _written_here(folder / name)), None)


def _written_here(path: Path) -> bool:
    return path.is_file() and not path.is_symlink() and _harness_wrote(path)


def _harness_wrote(path: Path) -> bool:
    recorded = _written(path.parent).get(path.name)
    return isinstance(recorded, str) and recorded == sha256_file(path)


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """An exclusive lock held on `path` (a folder, or a lock file made if missing) for the block: parallel jobs
    (Snakemake's) write files into one folder, and two processes may build one environment."""
    fd = os.open(path, os.O_RDONLY) if path.is_dir() else os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _record_written(path: Path, digest: str) -> None:
    folder = path.parent
    with locked(folder):
        record = {name: d for name, d in _written(folder).items() if (folder / name).is_file()}
        record[path.name] = digest
        tmp = folder / f"{WRITTEN}.{os.getpid()}"
        tmp.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
        os.replace(tmp, folder / WRITTEN)


def check_replaceable(dest: str | os.PathLike, owner: dict | None = None) -> None:
    """HarnessError unless writing `dest` deletes nothing the harness did not make as this very thing.

    A file may replace a file the harness wrote there and nobody changed since (WRITTEN); a directory (`owner`
    says what it is, e.g. {"kind": "run", "framework": ..., "seed": ...}) may replace an empty directory or one the
    harness made with the same owner (a rerun of that run). A link is replaced as a link: its target is never
    touched. Anything else, e.g. a results folder with history given as a run's --out, or a file of the user's
    given as --out, is refused, naming it.
    """
    dest = Path(dest)
    if not dest.exists() or dest.is_symlink():
        return
    if dest.is_dir():
        if owner is None:
            raise HarnessError(f"{dest}: an existing folder; refusing to replace it with a file (nothing was deleted)")
        if not any(dest.iterdir()):
            return
        what = " ".join(f"{k} {v}" for k, v in owner.items())
        mark = _owner_of(dest)
        if mark is not None and {k: v for k, v in mark.items() if k != MADE_FILES} == owner:
            foreign = _foreign_file(dest, mark)
            if foreign is None:
                return
            raise HarnessError(f"{dest}: the {what} made by remax-bench, but it holds {foreign}, which remax-bench "
                               "did not write there; refusing to replace the folder (nothing was deleted): move that "
                               "file out, or give another --out")
        raise HarnessError(f"{dest}: an existing folder that is not the {what} made by remax-bench; refusing to "
                           "replace it (nothing was deleted): give another --out, or remove it yourself")
    if owner is not None:
        raise HarnessError(f"{dest}: an existing file; refusing to replace it with a folder (nothing was deleted)")
    if not _harness_wrote(dest):
        raise HarnessError(f"{dest}: an existing file that remax-bench did not write (or that was changed since); "
                           "refusing to overwrite it (nothing was changed): give another --out, or remove it yourself")


@contextlib.contextmanager
def atomic_path(dest: str | os.PathLike, owner: dict | None = None) -> Iterator[Path]:
    """Yield a temporary sibling of `dest` (file or directory); rename it over `dest` only on success.

    A crash or an exception leaves `dest` as it was, so nothing half-written ever looks complete. A directory is
    written with `owner` (what it is) in OWNER, and replaces only what check_replaceable allows, checked before the
    work and again before the rename.
    """
    dest = Path(dest)
    check_replaceable(dest, owner)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent)) / dest.name
    try:
        yield tmp
        if tmp.is_dir() and not tmp.is_symlink():
            if owner is None:
                raise ValueError(f"{dest}: a directory written without an owner")
            (tmp / OWNER).write_text(json.dumps({**owner, MADE_FILES: _files_in(tmp)}, sort_keys=True) + "\n")
        digest = sha256_file(tmp) if tmp.is_file() and not tmp.is_symlink() else None
        check_replaceable(dest, owner)
        if dest.is_dir() and not dest.is_symlink():
            shutil.rmtree(dest)
        os.replace(tmp, dest)
        if digest is not None:
            _record_written(dest, digest)
    except OSError as e:
        if e.filename is not None:
            raise
        # A write into an open file (a full disk) names no file: name the one being written.
        raise HarnessError(f"{dest}: could not be written ({e.strerror or e})") from None
    finally:
        shutil.rmtree(tmp.parent, ignore_errors=True)


def write_text(dest: str | os.PathLike, text: str) -> None:
    with atomic_path(dest) as tmp:
        tmp.write_text(text)


def nan_as_null(value: object) -> object:
    """`value` with every float NaN in its dicts and lists as None (a figure a run does not have, the spread of an
    untested one): JSON has no NaN, and write_json refuses one."""
    if isinstance(value, dict):
        return {k: nan_as_null(v) for k, v in value.items()}
    if isinstance(value, list):
        return [nan_as_null(v) for v in value]
    return None if isinstance(value, float) and math.isnan(value) else value


def write_json(dest: str | os.PathLike, obj: object) -> None:
    write_text(dest, json.dumps(obj, indent=2, sort_keys=True, default=str, allow_nan=False) + "\n")


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


def _read_capped(path: Path, what: str, missing_hint: str, max_bytes: int) -> bytes:
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
    data = _read_capped(path, what, missing_hint, max_bytes)
    return parse_document(data, str(path), yaml_syntax=path.suffix != ".json")


def read_json_object(path: str | os.PathLike, what: str, missing_hint: str = "") -> dict:
    """The JSON object in `path`; HarnessError naming the file and what it should have been otherwise."""
    path = Path(path)
    data = _read_capped(path, what, missing_hint, MAX_DOCUMENT_BYTES)
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


def sha256_file(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def sha256_tree(path: str | os.PathLike) -> str:
    """Hash of a file, or of a directory as its sorted (relative path, file hash) pairs.

    Hidden files are left out: workflow managers drop markers into directory outputs (Snakemake's
    `.snakemake_timestamp`), and they are not part of the input.
    """
    path = Path(path).resolve()  # an input may be a link to a checkpoint kept elsewhere
    if path.is_file():
        return sha256_file(path)
    if not path.is_dir():
        raise HarnessError(f"{path}: input is missing")
    h = hashlib.sha256()
    files = (p for p in path.rglob("*")
             if p.is_file() and not any(part.startswith(".") for part in p.relative_to(path).parts))
    for f in sorted(files):
        h.update(f"{f.relative_to(path).as_posix()}\0{sha256_file(f)}\n".encode())
    return h.hexdigest()


def sidecar(path: str | os.PathLike) -> Path:
    return Path(f"{path}.sha256")


def record_hash(path: str | os.PathLike) -> str:
    """Write `<path>.sha256` in sha256sum format and return the digest."""
    digest = sha256_tree(path)
    write_text(sidecar(path), f"{digest}  {Path(path).name}\n")
    return digest


def verify_hash(path: str | os.PathLike) -> str:
    """The digest of an input built by the pipeline, checked against the one recorded when it was built."""
    path = Path(path)
    if not path.exists():
        raise HarnessError(f"{path}: input is missing (build it with the pipeline's inputs rules)")
    side = sidecar(path)
    if not side.is_file():
        raise HarnessError(f"{side}: no recorded sha256 for input {path}")
    recorded = next(iter(side.read_text().split()), "")
    actual = sha256_tree(path)
    if actual != recorded:
        raise HarnessError(
            f"{path}: sha256 mismatch (recorded in {side}: {recorded or 'nothing'}, actual: {actual}); "
            "the input was changed or corrupted after it was built: rebuild it"
        )
    return actual


def config_hash(config: dict) -> str:
    """Hash of an effective config (after defaults): two runs with equal hashes ran the same experiment. Here, not
    in harness.config, so that the manifest (written by every run) does not import the config's validation, which
    asks the framework registry for the known names."""
    return hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:16]
