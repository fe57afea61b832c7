"""Files written whole or not at all, and the hashes that tie every run to its inputs."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from harness import HarnessError

OWNER = ".remax-bench.json"  # in every directory the harness makes: what it is (hidden: sha256_tree leaves it out)


def _owner_of(path: Path) -> object:
    try:
        return json.loads((path / OWNER).read_text())
    except (OSError, ValueError):
        return None


def check_replaceable(dest: str | os.PathLike, owner: dict | None = None) -> None:
    """HarnessError unless writing `dest` deletes nothing the harness did not make as this very thing.

    A file may replace a file; a directory (`owner` says what it is, e.g. {"kind": "run", "framework": ..., "seed":
    ...}) may replace an empty directory or one the harness made with the same owner (a rerun of that run). A link is
    replaced as a link: its target is never touched. Anything else, e.g. a results folder with history given as a
    run's --out, is refused, naming it.
    """
    dest = Path(dest)
    if not dest.exists() or dest.is_symlink():
        return
    if dest.is_dir():
        if owner is None:
            raise HarnessError(f"{dest}: an existing folder; refusing to replace it with a file (nothing was deleted)")
        if not any(dest.iterdir()) or _owner_of(dest) == owner:
            return
        what = " ".join(f"{k} {v}" for k, v in owner.items())
        raise HarnessError(f"{dest}: an existing folder that is not the {what} made by remax-bench; refusing to "
                           "replace it (nothing was deleted): give another --out, or remove it yourself")
    if owner is not None:
        raise HarnessError(f"{dest}: an existing file; refusing to replace it with a folder (nothing was deleted)")


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
            (tmp / OWNER).write_text(json.dumps(owner, sort_keys=True) + "\n")
        check_replaceable(dest, owner)
        if dest.is_dir() and not dest.is_symlink():
            shutil.rmtree(dest)
        os.replace(tmp, dest)
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


def write_json(dest: str | os.PathLike, obj: object) -> None:
    write_text(dest, json.dumps(obj, indent=2, sort_keys=True, default=str, allow_nan=False) + "\n")


def _no_constant(name: str) -> object:
    raise ValueError(f"{name} is not a number JSON allows")


def strict_json(text: str | bytes) -> object:
    """json.loads without NaN and Infinity: a value the harness never writes (write_json refuses them), so one in a
    file is damage, and would otherwise pass every comparison silently."""
    return json.loads(text, parse_constant=_no_constant)


def read_json_object(path: str | os.PathLike, what: str, missing_hint: str = "") -> dict:
    """The JSON object in `path`; HarnessError naming the file and what it should have been otherwise."""
    try:
        data = strict_json(Path(path).read_text())
    except FileNotFoundError:
        raise HarnessError(f"{path}: {what} not found{missing_hint}") from None
    except (OSError, ValueError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise HarnessError(f"{path}: {what} is not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise HarnessError(f"{path}: {what} should be a JSON object, not {type(data).__name__}")
    return data


def read_jsonl(path: str | os.PathLike, bad_line: str = "not valid JSON") -> Iterator[tuple[int, object]]:
    """(line number, value) of each line of a JSON-lines file; a line that is not JSON stops it, naming the file and
    the line (`bad_line` says what the line should have been). The caller checks each value's shape."""
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            try:
                yield lineno, strict_json(line)
            except ValueError as e:
                raise HarnessError(f"{path}:{lineno}: {bad_line} ({getattr(e, 'msg', e)})") from None


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
