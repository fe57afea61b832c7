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
from contextlib import AbstractContextManager
from pathlib import Path
from typing import overload

from harness import HarnessError
from harness.reading import (
    LOG_TAIL_BYTES,
    MAX_DEPTH,
    MAX_DOCUMENT_BYTES,
    MAX_LINE_BYTES,
    bounded_tree,
    log_tail,
    parse_document,
    read_capped,
    read_document,
    read_json_object,
    read_jsonl,
    strict_json,
    text_lines,
)

# The record-reading half of this module is harness.reading; its names are importable from here too, as they were
# before it moved.
__all__ = ["LOG_TAIL_BYTES", "MADE_FILES", "MARKERS", "MAX_DEPTH", "MAX_DOCUMENT_BYTES", "MAX_LINE_BYTES",
           "MAX_SIDECAR_BYTES", "OWNER", "SIDECAR_ROLE", "WRITTEN", "atomic_path", "bounded_tree",
           "check_replaceable", "config_hash", "locked", "log_tail", "nan_as_null", "parse_document",
           "read_capped", "read_document", "read_json_object", "read_jsonl", "record_hash", "sha256_file",
           "sha256_tree", "sidecar", "strict_json", "text_lines", "verify_hash", "write_json", "write_text"]

OWNER = ".remax-bench.json"  # in every directory the harness makes: what it is (hidden: sha256_tree leaves it out)
# OWNER's key listing the files (relative paths, names only: a run folder can hold GB checkpoints) the directory held
# when the harness made it; the rest of OWNER says what the directory is.
MADE_FILES = "files"
# In every folder the harness writes a file into: {file name: {"role": what the file is, "sha256": of the file as
# written}}. A file may be replaced only by a write in the same role (`--out` names a role: a bundle replaces a bundle,
# never a summary), and only while it is exactly what the harness wrote there (hidden, like OWNER).
WRITTEN = ".remax-bench-files.json"
# Files in a harness-made folder that nobody's work is in: Snakemake's marker in a directory() output, and the
# harness's own records.
MARKERS = frozenset({".snakemake_timestamp", OWNER, WRITTEN})


def _small_json(path: Path) -> object:
    """A record of the harness's own (OWNER, WRITTEN), or None where it is missing, unreadable or too large."""
    try:
        return strict_json(read_capped(path, "record", "", MAX_DOCUMENT_BYTES))
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


def _recorded(path: Path) -> tuple[str | None, str | None]:
    """(sha256, role) of the file at `path` as the harness wrote it; (None, None) where it did not write it. An entry
    written before roles existed is a plain sha256, its role None: such a file is replaced by a write in any role, as
    before, the way an OWNER without its file list is (_foreign_file)."""
    entry = _written(path.parent).get(path.name)
    if isinstance(entry, str):
        return entry, None
    if isinstance(entry, dict) and isinstance(entry.get("sha256"), str) and isinstance(entry.get("role"), str):
        return entry["sha256"], entry["role"]
    return None, None


def _harness_wrote(path: Path) -> bool:
    digest = _recorded(path)[0]
    return digest is not None and digest == sha256_file(path)


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


def _record_written(path: Path, digest: str, role: str) -> None:
    folder = path.parent
    with locked(folder):
        record = {name: d for name, d in _written(folder).items() if (folder / name).is_file()}
        record[path.name] = {"role": role, "sha256": digest}
        tmp = folder / f"{WRITTEN}.{os.getpid()}"
        tmp.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
        os.replace(tmp, folder / WRITTEN)


@overload
def check_replaceable(dest: str | os.PathLike, owner: dict, *, role: None = None) -> None: ...
@overload
def check_replaceable(dest: str | os.PathLike, owner: None = None, *, role: str) -> None: ...
def check_replaceable(dest: str | os.PathLike, owner: dict | None = None, *, role: str | None = None) -> None:
    """HarnessError unless writing `dest` deletes nothing the harness did not make as this very thing.

    A file (`role` says what it is: "summary", "bundle") may replace a file the harness wrote there in the same role
    and nobody changed since (WRITTEN); a directory (`owner` says what it is, e.g. {"kind": "run", "framework": ...,
    "seed": ...}) may replace an empty directory or one the harness made with the same owner (a rerun of that run).
    A link is replaced as a link: its target is never touched. Anything else, e.g. a results folder with history
    given as a run's --out, a file of the user's, or a summary given as a bundle's --out, is refused, naming it.
    """
    _check_replaceable(Path(dest), _what(dest, owner, role))


def _what(dest: str | os.PathLike, owner: dict | None, role: str | None) -> dict | str:
    """The owner of a folder or the role of a file being written: one of them, never both, never neither (the
    overloads hold typed callers to that; the benchmarks are not type-checked)."""
    if owner is not None and role is None:
        return owner
    if role is not None and owner is None:
        return role
    raise ValueError(f"{dest}: a write is either a folder with an owner or a file with a role")


def _check_replaceable(dest: Path, what: dict | str) -> None:
    if not dest.exists() or dest.is_symlink():
        return
    if dest.is_dir():
        if not isinstance(what, dict):
            raise HarnessError(f"{dest}: an existing folder; refusing to replace it with a file (nothing was deleted)")
        if not any(dest.iterdir()):
            return
        owner = " ".join(f"{k} {v}" for k, v in what.items())
        mark = _owner_of(dest)
        if mark is not None and {k: v for k, v in mark.items() if k != MADE_FILES} == what:
            foreign = _foreign_file(dest, mark)
            if foreign is None:
                return
            raise HarnessError(f"{dest}: the {owner} made by remax-bench, but it holds {foreign}, which remax-bench "
                               "did not write there; refusing to replace the folder (nothing was deleted): move that "
                               "file out, or give another --out")
        raise HarnessError(f"{dest}: an existing folder that is not the {owner} made by remax-bench; refusing to "
                           "replace it (nothing was deleted): give another --out, or remove it yourself")
    if isinstance(what, dict):
        raise HarnessError(f"{dest}: an existing file; refusing to replace it with a folder (nothing was deleted)")
    if not _harness_wrote(dest):
        raise HarnessError(f"{dest}: an existing file that remax-bench did not write (or that was changed since); "
                           "refusing to overwrite it (nothing was changed): give another --out, or remove it yourself")
    held = _recorded(dest)[1]
    if held is not None and held != what:
        article = "an" if what[:1].lower() in "aeiou" else "a"
        raise HarnessError(f"{dest}: the {held} remax-bench wrote; refusing to replace it with {article} {what} "
                           "(nothing was changed): give another --out, or remove it yourself")


@overload
def atomic_path(dest: str | os.PathLike, owner: dict, *, role: None = None) -> AbstractContextManager[Path]: ...
@overload
def atomic_path(dest: str | os.PathLike, owner: None = None, *, role: str) -> AbstractContextManager[Path]: ...
def atomic_path(dest: str | os.PathLike, owner: dict | None = None, *,
                role: str | None = None) -> AbstractContextManager[Path]:
    """Yield a temporary sibling of `dest` (file or directory); rename it over `dest` only on success.

    A crash or an exception leaves `dest` as it was, so nothing half-written ever looks complete. A directory is
    written with `owner` (what it is) in OWNER, a file with `role` (what it is) in WRITTEN; either replaces only
    what check_replaceable allows, checked before the work and again before the rename.
    """
    return _atomic_path(Path(dest), _what(dest, owner, role))


@contextlib.contextmanager
def _atomic_path(dest: Path, what: dict | str) -> Iterator[Path]:
    _check_replaceable(dest, what)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent)) / dest.name
    try:
        yield tmp
        if tmp.is_dir() and not tmp.is_symlink():
            if not isinstance(what, dict):
                raise ValueError(f"{dest}: a directory written without an owner")
            (tmp / OWNER).write_text(json.dumps({**what, MADE_FILES: _files_in(tmp)}, sort_keys=True) + "\n")
        digest = sha256_file(tmp) if tmp.is_file() and not tmp.is_symlink() else None
        if digest is not None and not isinstance(what, str):
            raise ValueError(f"{dest}: a file written without a role")
        _check_replaceable(dest, what)
        if dest.is_dir() and not dest.is_symlink():
            shutil.rmtree(dest)
        os.replace(tmp, dest)
        if digest is not None and isinstance(what, str):
            _record_written(dest, digest, what)
    except OSError as e:
        if e.filename is not None:
            raise
        # A write into an open file (a full disk) names no file: name the one being written.
        raise HarnessError(f"{dest}: could not be written ({e.strerror or e})") from None
    finally:
        shutil.rmtree(tmp.parent, ignore_errors=True)


def write_text(dest: str | os.PathLike, text: str, *, role: str) -> None:
    with atomic_path(dest, role=role) as tmp:
        tmp.write_text(text)


def nan_as_null(value: object) -> object:
    """`value` with every float NaN in its dicts and lists as None (a figure a run does not have, the spread of an
    untested one): JSON has no NaN, and write_json refuses one."""
    if isinstance(value, dict):
        return {k: nan_as_null(v) for k, v in value.items()}
    if isinstance(value, list):
        return [nan_as_null(v) for v in value]
    return None if isinstance(value, float) and math.isnan(value) else value


def write_json(dest: str | os.PathLike, obj: object, *, role: str) -> None:
    write_text(dest, json.dumps(obj, indent=2, sort_keys=True, default=str, allow_nan=False) + "\n", role=role)


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


SIDECAR_ROLE = "sha256 record"  # what `<input>.sha256` is (harness.io.WRITTEN)
# A sidecar is one sha256sum line (64 hex digits, two spaces, the input's file name): one larger is not a sidecar,
# and is refused before it is held in memory whole (a 40 MB one cost `bundle` 980 MB).
MAX_SIDECAR_BYTES = 4096


def sidecar(path: str | os.PathLike) -> Path:
    return Path(f"{path}.sha256")


def record_hash(path: str | os.PathLike) -> str:
    """Write `<path>.sha256` in sha256sum format and return the digest."""
    digest = sha256_tree(path)
    write_text(sidecar(path), f"{digest}  {Path(path).name}\n", role=SIDECAR_ROLE)
    return digest


def verify_hash(path: str | os.PathLike) -> str:
    """The digest of an input built by the pipeline, checked against the one recorded when it was built."""
    path = Path(path)
    if not path.exists():
        raise HarnessError(f"{path}: input is missing (build it with the pipeline's inputs rules)")
    side = sidecar(path)
    if not side.is_file():
        raise HarnessError(f"{side}: no recorded sha256 for input {path}")
    recorded = next(iter(read_capped(side, SIDECAR_ROLE, "", MAX_SIDECAR_BYTES).decode(errors="replace").split()), "")
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
