"""`remax-bench bundle RESULTS --out NAME.tar.gz`: a finished comparison as one file to publish, and its checked
opening on another machine (docs/reproducibility.md, "Publishing a comparison: the bundle").

The bundle is a gzip tar whose one top folder, TOP, is laid out like the results directory it came from, so code that
reads a results directory reads an opened bundle:

    remax-bench-bundle/
      bundle.json                         what is in it: format, harness commit, runs, inputs, environments, and
                                          the sha256 of every other file
      config.json  summary.csv  [conformance.csv]
      runs/<framework>/seed<N>/manifest.json  [plan.json eval.json launch.json]
      metrics/<framework>/seed<N>.parquet
      inputs/...                          the shared inputs the harness generated, as they are (with their .sha256
                                          and .build.json records): a reader rebuilds nothing
      environments/<env>.txt              each environment's package lock as the runs' manifests recorded it

Left out, for size: the frameworks' raw logs, checkpoints and consoles (the metrics parquet holds what was measured
from them), the repeats (repeats/: a check of the original's determinism, not part of the comparison), the plans'
folders (each run holds a copy of its plan.json), and an input that is a link to a checkpoint of the user's (a 7B
model): bundle.json records its sha256 and path, bundled false, so whoever reproduces supplies it. Files the harness
keeps for itself (.remax-bench*.json, Snakemake's .snakemake_timestamp: every hidden file) are not bundled.

open_bundle trusts nothing in the file: a bundle is downloaded from someone else. Every entry is checked before it
is written, into a folder of its own that appears only when every file matched bundle.json.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import re
import tarfile
import zlib
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import IO, cast

from harness import HarnessError
from harness.inputs import DATASET, POLICY, REWARD, REWARD_MODEL
from harness.io import MAX_DOCUMENT_BYTES, atomic_path, parse_document, read_json_object, sha256_tree, verify_hash
from harness.results import layout
from harness.results.records import INTEGER, LIST, OBJECT, TEXT, check_shape, read_manifest

TOP = "remax-bench-bundle"
RECORD = "bundle.json"
FORMAT = 1
OWNER = {"kind": "bundle"}  # what an opened bundle's folder is (harness.io.OWNER)
RUN_RECORDS = ("manifest.json", "plan.json", "eval.json", "launch.json")
# Where each input a manifest names lives under results/inputs (harness.inputs builds them there).
INPUT_PLACES = {"dataset": DATASET, "policy": POLICY, "reward": REWARD}
# Bounds on what opening a bundle may write: a profile's bundle is meant to stay within tens of MB and thousands of
# files (#50 asks 50 MB of the cpu-frameworks one), so a bundle past these is damage or a decompression bomb,
# stopped before it fills the disk.
MAX_BYTES = 4 << 30
MAX_MEMBERS = 100_000
# The most of the decompressed tar read at once: a file is read a CHUNK at a time, so a larger read is a header's
# (a pax or GNU long name header), which tarfile would hold in memory whole.
MAX_READ = 16 << 20
CHUNK = 1 << 20
SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")  # an environment's file name, made from a manifest's text

BUNDLE_SHAPE = {"format": INTEGER, "created": TEXT, "runs": LIST, "runs.*": OBJECT, "inputs": OBJECT,
                "environments": OBJECT, "files": OBJECT, "files.*": TEXT}

Member = bytes | Path  # a bundled file's content: generated here, or copied from the results directory


def _runs(results: Path) -> list[tuple[Path, dict]]:
    """(run directory, manifest) of every runs/<framework>/seed<N>, in order; HarnessError for a run without a
    readable manifest."""
    found = []
    for fw_dir in sorted(p for p in (results / "runs").glob("*") if p.is_dir() and not p.name.startswith(".")):
        # The pattern skips atomic_path's temporaries (.seed1.xxxx) of a run still being written.
        for run in sorted(p for p in fw_dir.glob("seed*") if p.is_dir() and re.fullmatch(r"seed\d+", p.name)):
            found.append((run, read_manifest(run / "manifest.json", ("framework", "seed", "run_id", "inputs"))))
    if not found:
        raise HarnessError(f"{results / 'runs'}: no run to bundle (runs/<framework>/seed<N> with a manifest.json)")
    return found


def _run_members(results: Path, run: Path, manifest: dict) -> dict[str, Member]:
    fw, seed = manifest["framework"], manifest["seed"]
    if run != layout.path(results, layout.RUN, framework=fw, seed=seed):
        raise HarnessError(f"{run}/manifest.json: records the run {fw} seed {seed}, which does not live here")
    metrics = layout.path(results, layout.METRICS, framework=fw, seed=seed)
    if not metrics.is_file():
        raise HarnessError(f"{metrics}: the run's metrics are missing (ingest the run before bundling)")
    rel_run = layout.RUN.format(framework=fw, seed=seed)
    members: dict[str, Member] = {f"{rel_run}/{name}": run / name for name in RUN_RECORDS if (run / name).is_file()}
    members[layout.METRICS.format(framework=fw, seed=seed)] = metrics
    return members


def _git(manifests: list[dict]) -> dict | list:
    """The harness commit that made the runs; each one, with its runs, where they differ."""
    commits: dict[tuple, list[str]] = {}
    for m in manifests:
        git = m.get("git", {})
        commits.setdefault((git.get("commit"), git.get("dirty")), []).append(m["run_id"])
    listed = [{"commit": c, "dirty": d, "runs": runs} for (c, d), runs in commits.items()]
    return {k: listed[0][k] for k in ("commit", "dirty")} if len(listed) == 1 else listed


def _environments(manifests: list[dict]) -> tuple[dict[str, list[str]], list[str]]:
    """{environment: pip-freeze lines} and each run's environment, in the runs' order. An embedded backend ran in
    the harness's own environment, whose versions its manifest records as "harness"; an environment whose lock
    differs between runs (rebuilt between them) is kept once per lock, named after the first run with it."""
    envs: dict[str, list[str]] = {}
    names = []
    for m in manifests:
        env = m.get("environment")
        if env is None:
            name = "harness"
            lines = [f"{k}=={v}" if v else k for k, v in sorted(m.get("versions", {}).items())]
        else:
            name, lines = str(env.get("name") or "environment"), list(env.get("packages") or [])
        if not SAFE_NAME.fullmatch(name):
            raise HarnessError(f"manifest of {m['run_id']}: environment name {name!r} is not a file name")
        key = next((k for k, v in envs.items() if v == lines and (k == name or k.startswith(f"{name}@"))), None)
        if key is None:
            key = name if name not in envs else f"{name}@{m['run_id']}"
            envs[key] = lines
        names.append(key)
    return envs, names


def _has_link(path: Path) -> bool:
    """Whether `path` is a link or holds one: a link points where the bundle cannot follow (a user's checkpoint)."""
    if path.is_symlink():
        return True
    return path.is_dir() and any(Path(d, n).is_symlink() for d, dirs, files in os.walk(path) for n in dirs + files)


def _input_record(inputs: Path, name: str, recorded: dict) -> dict:
    """bundle.json's record of one input: its sha256 and path as the runs recorded them, and whether the bundle
    holds it. A generated input in results/inputs must be the one the runs used: one rebuilt since would publish
    another experiment's inputs (HarnessError)."""
    out = {"sha256": recorded.get("sha256"), "path": recorded["path"], "bundled": False}
    if name not in INPUT_PLACES or not (inputs / INPUT_PLACES[name]).exists():
        return out  # the runs read their inputs elsewhere: nothing here to bundle
    place = inputs / INPUT_PLACES[name]
    if recorded.get("kind") == "rule":  # the rule is code, pinned by the harness commit; reward.json says which
        return {**out, "kind": "rule", "bundled": not _has_link(place)}
    if name == "reward":
        out["kind"] = recorded.get("kind")
        if recorded.get("kind") == "model":
            place = place / REWARD_MODEL
    if _has_link(place):
        return out
    actual = verify_hash(place) if place.name != REWARD_MODEL else sha256_tree(place)
    if actual != recorded.get("sha256"):
        raise HarnessError(f"{place}: sha256 {actual}, but the runs used {name} with sha256 {recorded.get('sha256')}:"
                           " the input was rebuilt after the runs; bundle the results the runs were made with")
    return {**out, "bundled": True}


def _inputs(results: Path, manifests: list[dict]) -> tuple[dict, dict[str, Member]]:
    """bundle.json's "inputs", and the files under results/inputs to bundle: every regular, visible one not behind a
    link (hidden ones are the harness's and Snakemake's markers, which sha256_tree leaves out of an input too)."""
    recorded: dict[str, tuple[dict, str]] = {}
    for m in manifests:
        for name, rec in m["inputs"].items():
            first, by = recorded.setdefault(name, (rec, m["run_id"]))
            if first.get("sha256") != rec.get("sha256"):
                raise HarnessError(f"{results}: runs {by} and {m['run_id']} used different {name} inputs (sha256 "
                                   f"{first.get('sha256')} and {rec.get('sha256')}): not one comparison")
    inputs = results / layout.INPUTS
    records = {name: _input_record(inputs, name, rec) for name, (rec, _) in sorted(recorded.items())}
    members: dict[str, Member] = {}
    for folder, dirs, files in os.walk(inputs):  # links to folders are listed in dirs, and not walked into
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for f in sorted(files):
            path = Path(folder, f)
            if not f.startswith(".") and path.is_file() and not path.is_symlink():
                members[path.relative_to(results).as_posix()] = path
    return records, members


class _Hashing(io.RawIOBase):
    """A file read once: into the tar, and into its sha256 on the way (so a file changed while it is bundled is
    caught by open_bundle instead of recorded under a hash of another content)."""

    def __init__(self, f: IO[bytes]):
        self.f, self.hash = f, hashlib.sha256()

    def read(self, n: int = -1) -> bytes:
        data = self.f.read(n)
        self.hash.update(data)
        return data


def _write_tar(dest: Path, members: dict[str, Member], record: dict, mtime: int) -> None:
    """The tar, each file under TOP with plain permissions and no owner, bundle.json last: it records the sha256 of
    what was written before it."""
    files: dict[str, str] = {}
    with tarfile.open(dest, "w:gz", format=tarfile.PAX_FORMAT) as tar:
        for name in sorted(members):
            content = members[name]
            info = tarfile.TarInfo(f"{TOP}/{name}")
            info.mode, info.mtime = 0o644, mtime
            if isinstance(content, bytes):
                info.size = len(content)
                tar.addfile(info, io.BytesIO(content))
                files[name] = hashlib.sha256(content).hexdigest()
                continue
            with open(content, "rb") as f:
                info.size = os.fstat(f.fileno()).st_size
                reader = _Hashing(f)
                tar.addfile(info, reader)
            files[name] = reader.hash.hexdigest()
        data = (json.dumps({**record, "files": files}, indent=2, sort_keys=True, allow_nan=False) + "\n").encode()
        info = tarfile.TarInfo(f"{TOP}/{RECORD}")
        info.mode, info.mtime, info.size = 0o644, mtime, len(data)
        tar.addfile(info, io.BytesIO(data))


def make_bundle(results_dir: str | Path, out: str | Path) -> dict:
    """Write the bundle of `results_dir` to `out` (a .tar.gz; never over a file the harness did not write);
    {"path", "bytes", "runs", "files"}. HarnessError naming the path for a results directory without config.json,
    summary.csv or any run, a run without a readable manifest or metrics, inputs the runs did not use."""
    results = Path(results_dir)
    for name in (layout.CONFIG, layout.SUMMARY):
        if not (results / name).is_file():
            raise HarnessError(f"{results / name}: missing; not a finished results directory (bundle one the "
                               "pipeline completed)")
    runs = _runs(results)
    manifests = [m for _, m in runs]
    members: dict[str, Member] = {name: results / name for name in (layout.CONFIG, layout.SUMMARY,
                                                                   layout.CONFORMANCE) if (results / name).is_file()}
    for run, manifest in runs:
        members.update(_run_members(results, run, manifest))
    inputs, input_files = _inputs(results, manifests)
    members.update(input_files)
    envs, env_of = _environments(manifests)
    members.update({f"environments/{name}.txt": "".join(f"{line}\n" for line in lines).encode()
                    for name, lines in envs.items()})
    now = datetime.now(UTC)
    record = {"format": FORMAT, "created": now.isoformat(timespec="seconds"), "harness": _git(manifests),
              "runs": [{"framework": m["framework"], "seed": m["seed"], "run_id": m["run_id"], "environment": env}
                       for m, env in zip(manifests, env_of)],
              "inputs": inputs, "environments": envs}
    with atomic_path(out) as tmp:
        _write_tar(tmp, members, record, int(now.timestamp()))
    return {"path": str(out), "bytes": Path(out).stat().st_size, "runs": len(runs), "files": len(members) + 1}


def _entry_name(member: tarfile.TarInfo, where: str) -> str | None:
    """The path under TOP of a tar entry that may be written (None for a folder, made as files need it);
    HarnessError naming the entry for anything that could write elsewhere or is not a plain file."""
    name = member.name
    if name.startswith("/") or PurePosixPath(name).is_absolute() or "\\" in name or re.match(r"[A-Za-z]:", name):
        raise HarnessError(f"{where}: entry {name!r}: an absolute path; refused (nothing was extracted)")
    parts = name.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise HarnessError(f"{where}: entry {name!r}: '..', '.' or an empty part in its path; refused (nothing was "
                           "extracted)")
    if parts[0] != TOP or (len(parts) == 1 and not member.isdir()):
        raise HarnessError(f"{where}: entry {name!r}: outside the bundle's folder {TOP}/; refused (nothing was "
                           "extracted)")
    if member.issym() or member.islnk():
        raise HarnessError(f"{where}: entry {name!r}: a link (to {member.linkname!r}); a bundle holds plain files "
                           "only: refused (nothing was extracted)")
    if member.isdir():
        return None
    if member.type not in (tarfile.REGTYPE, tarfile.AREGTYPE):
        what = "a device or fifo" if member.isdev() else f"an entry of tar type {member.type!r}"
        raise HarnessError(f"{where}: entry {name!r}: {what}; a bundle holds plain files only: refused (nothing was "
                           "extracted)")
    if any(p.startswith(".") for p in parts[1:]):
        raise HarnessError(f"{where}: entry {name!r}: a hidden file, which a bundle never holds (the harness keeps "
                           "its own records in them); refused (nothing was extracted)")
    return "/".join(parts[1:])


class _Bounded:
    """The decompressed tar as tarfile reads it, within MAX_READ a read and MAX_BYTES (and the headers of MAX_MEMBERS
    entries) in all: a header claiming gigabytes is refused before it is read into memory."""

    def __init__(self, f: gzip.GzipFile, where: str):
        self.f, self.where = f, where

    def read(self, n: int = -1) -> bytes:
        if n < 0 or n > MAX_READ or self.f.tell() + n > MAX_BYTES + MAX_MEMBERS * 4096:
            raise HarnessError(f"{self.where}: a tar header or entry past the bounds of a bundle ({n} bytes at "
                               f"offset {self.f.tell()}); not a bundle (nothing was extracted)")
        return self.f.read(n)

    def seek(self, offset: int, whence: int = 0) -> int:
        return self.f.seek(offset, whence)

    def tell(self) -> int:
        return self.f.tell()


def _copy_out(tar: tarfile.TarFile, member: tarfile.TarInfo, target: Path, budget: int) -> str:
    """Write one entry's bytes to `target` (a new file), at most `budget` of them; its sha256."""
    src = tar.extractfile(member)
    if src is None:
        raise HarnessError(f"entry {member.name!r}: cannot be read")
    h, written = hashlib.sha256(), 0
    with src, open(target, "xb") as dst:
        while chunk := src.read(CHUNK):
            written += len(chunk)
            if written > budget:
                raise HarnessError(f"entry {member.name!r}: more than {MAX_BYTES} bytes of files in all; not a "
                                   "bundle (nothing was extracted)")
            h.update(chunk)
            dst.write(chunk)
    return h.hexdigest()


def _extract(path: Path, dest: Path) -> dict[str, str]:
    """Every file of the bundle at `path` written under `dest` (a new folder); {path under TOP: sha256}."""
    digests: dict[str, str] = {}
    total = 0
    try:
        with gzip.GzipFile(path, "rb") as gz, tarfile.open(fileobj=cast(IO[bytes], _Bounded(gz, str(path))),
                                                       mode="r:") as tar:
            for count, member in enumerate(tar, 1):
                if count > MAX_MEMBERS:
                    raise HarnessError(f"{path}: more than {MAX_MEMBERS} entries; not a bundle (nothing was "
                                       "extracted)")
                name = _entry_name(member, str(path))
                if name is None:
                    continue
                if name in digests:
                    raise HarnessError(f"{path}: entry {member.name!r} appears twice; refused (nothing was extracted)")
                if total + member.size > MAX_BYTES:
                    raise HarnessError(f"{path}: entry {member.name!r}: more than {MAX_BYTES} bytes of files in "
                                       "all; not a bundle (nothing was extracted)")
                target = dest.joinpath(*name.split("/"))
                try:
                    target.parent.mkdir(parents=True, exist_ok=True)
                    digests[name] = _copy_out(tar, member, target, MAX_BYTES - total)
                except OSError as e:  # a file where a folder should be, or a full disk
                    if isinstance(e, gzip.BadGzipFile):  # an OSError, but of the bundle's bytes: below
                        raise
                    raise HarnessError(f"{path}: entry {member.name!r} could not be written ({e.strerror or e}); "
                                       "nothing was extracted") from None
                total += member.size
    except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile) as e:
        raise HarnessError(f"{path}: not a whole gzip tar ({e or type(e).__name__}): damaged or truncated; "
                           "nothing was extracted") from None
    return digests


def _check_listing(path: Path, dest: Path, digests: dict[str, str]) -> dict:
    """bundle.json, after checking that the bundle holds exactly the files it lists, each with its sha256."""
    where = f"{path}: {TOP}/{RECORD}"
    if RECORD not in digests:
        raise HarnessError(f"{where} is missing: not a remax-bench bundle, or a truncated one; nothing was extracted")
    if (dest / RECORD).stat().st_size > MAX_DOCUMENT_BYTES:
        raise HarnessError(f"{where}: larger than {MAX_DOCUMENT_BYTES} bytes; not a bundle record")
    record = check_shape(parse_document((dest / RECORD).read_bytes(), where, yaml_syntax=False), BUNDLE_SHAPE,
                         where, ("format", "files", "runs"), "bundle record")
    if record["format"] != FORMAT:
        raise HarnessError(f"{where}: format {record['format']}; this remax-bench reads format {FORMAT}")
    listed, held = record["files"], {k: v for k, v in digests.items() if k != RECORD}
    missing = sorted(set(listed) - set(held))
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise HarnessError(f"{path}: {TOP}/{missing[0]}{more}: listed in {RECORD} but not in the bundle: truncated "
                           "or cut down; nothing was extracted")
    unlisted = sorted(set(held) - set(listed))
    if unlisted:
        raise HarnessError(f"{path}: {TOP}/{unlisted[0]}: in the bundle but not listed in {RECORD}: added after it "
                           "was made; nothing was extracted")
    for name in sorted(listed):
        if held[name] != listed[name]:
            raise HarnessError(f"{path}: {TOP}/{name}: sha256 {held[name]}, but {RECORD} records {listed[name]}: "
                               "changed after the bundle was made; nothing was extracted")
    return record


def open_bundle(path: str | Path, into: str | Path) -> Path:
    """Extract the bundle at `path` into the folder `into`, laid out like a results directory; `into`. The folder
    appears only when every entry was a plain file inside the bundle's folder and every file matched bundle.json;
    otherwise HarnessError naming the entry, and nothing is written (`into`, if it was there, is as it was). An
    existing `into` is replaced only when it is empty or an opened bundle itself (harness.io.check_replaceable)."""
    path, into = Path(path), Path(into)
    if not path.is_file():
        raise HarnessError(f"{path}: no bundle there (a .tar.gz made by `remax-bench bundle`)")
    with atomic_path(into, OWNER) as tmp:
        tmp.mkdir()
        _check_listing(path, tmp, _extract(path, tmp))
    return into


def describe(into: str | Path) -> dict:
    """The record of an opened bundle (bundle.json), read back bounded."""
    return read_json_object(Path(into) / RECORD, "bundle record")

