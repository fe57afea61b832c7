"""`remax-bench bundle RESULTS --out NAME.tar.gz`: a finished comparison as one file to publish, opened checked on
another machine by harness.runs.unbundle (docs/reproducibility.md, "Publishing a comparison: the bundle").

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

Only the results directory's own regular files go in, never what a link points to (a file that is not the run's
would be published), checked at every part of each path below the results directory, and opened with O_NOFOLLOW:
- a link among the comparison's records (config.json, summary.csv, conformance.csv; runs/, runs/<framework>,
  seed<N> or a run's record; metrics/ or a run's metrics; an input's .sha256 or build record) is an error naming it:
  leaving a run's manifest out would publish a broken bundle, and its target is not the run's;
- an input that is a link or holds one (a user's checkpoint), or an inputs/ that is a link, is recorded, not bundled
  (bundle.json: its sha256 and path, bundled false), as above: whoever reproduces supplies it;
- under inputs/, only the inputs' own files (INPUT_PLACES, INPUT_RECORDS), never a file beside them.
config.json must be the effective config whose config_hash every run's manifest records, and summary.csv a summary
table (harness.results.summarize.read_summary), before anything is written.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import stat
import tarfile
from datetime import UTC, datetime
from pathlib import Path
from typing import IO

from harness import HarnessError
from harness.config import validate_config
from harness.inputs import BUILD_RECORD, DATASET, POLICY, REWARD, REWARD_MODEL
from harness.io import atomic_path, config_hash, read_json_object, sha256_tree, sidecar, verify_hash
from harness.results import layout
from harness.results.records import read_manifest
from harness.runs import unbundle
from harness.runs.unbundle import FORMAT, RECORD, TOP, shown

BUNDLE_ROLE = "bundle"  # what `bundle --out` writes (harness.io.WRITTEN): a bundle replaces a bundle, nothing else

RUN_RECORDS = ("manifest.json", "plan.json", "eval.json", "launch.json")
# Where each input a manifest names lives under results/inputs (harness.inputs builds them there), and the records
# harness.inputs writes beside them: each one's sha256 (harness.io.sidecar) and how the policy was built. Nothing
# else under inputs/ is bundled.
INPUT_PLACES = {"dataset": DATASET, "policy": POLICY, "reward": REWARD}
INPUT_RECORDS = (*(sidecar(place).as_posix() for place in INPUT_PLACES.values()), BUILD_RECORD)
SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")  # an environment's file name, made from a manifest's text

# a bundled file's content: generated here, or the file results/<its name in the bundle> of the results directory
Member = bytes | Path


def _link_on_the_way(results: Path, rel: str) -> Path | None:
    """The first of results/rel and the folders above it, below `results`, that is a link; None where none is."""
    path = results
    for part in rel.split("/"):
        path = path / part
        if path.is_symlink():
            return path
    return None


def _refuse_link(link: Path) -> HarnessError:
    return HarnessError(f"{link}: a link (to {shown(os.readlink(link))}); a bundle holds the results directory's own "
                        "files, never what a link points to: put the file itself there, or bundle the results "
                        "directory the link points into")


def _own(results: Path, rel: str) -> Path | None:
    """results/rel where it is a regular file, None where none is there; HarnessError naming the link where it, or
    a folder on the way below `results`, is one."""
    link = _link_on_the_way(results, rel)
    if link is not None:
        raise _refuse_link(link)
    return results / rel if (results / rel).is_file() else None


def _folders(results: Path, rel: str, pattern: str) -> list[Path]:
    """The folders in results/rel whose names match `pattern`, in order; HarnessError naming a link among them or on
    the way to results/rel (a run whose folder is a link is not the results directory's)."""
    link = _link_on_the_way(results, rel)
    if link is not None:
        raise _refuse_link(link)
    if not (results / rel).is_dir():
        return []
    found = []
    for path in sorted(p for p in (results / rel).iterdir() if re.fullmatch(pattern, p.name)):
        if path.is_symlink():
            raise _refuse_link(path)
        if path.is_dir():
            found.append(path)
    return found


def _open_own(results: Path, rel: str) -> IO[bytes]:
    """results/rel opened for reading, each part of `rel` with O_NOFOLLOW: a file swapped for a link since it was
    checked is not followed either. O_NONBLOCK: a fifo put there does not hang the bundle (it is then refused)."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK
    parts = rel.split("/")
    fd = os.open(results, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for i, part in enumerate(parts):
            fd, parent = os.open(part, flags | (os.O_DIRECTORY if i < len(parts) - 1 else 0), dir_fd=fd), fd
            os.close(parent)
    except OSError as e:
        os.close(fd)
        raise HarnessError(f"{results / rel}: cannot be read without following a link ({e.strerror}): it changed "
                           "while it was bundled; nothing was written") from None
    f = os.fdopen(fd, "rb")
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        f.close()
        raise HarnessError(f"{results / rel}: not a regular file (it changed while it was bundled); nothing was "
                           "written")
    return f


def _runs(results: Path) -> list[tuple[Path, dict]]:
    """(run directory, manifest) of every runs/<framework>/seed<N>, in order; HarnessError for a run without a
    readable manifest."""
    found = []
    # The patterns skip hidden folders and atomic_path's temporaries (.seed1.xxxx) of a run still being written.
    for fw_dir in _folders(results, "runs", r"[^.].*"):
        for run in _folders(results, f"runs/{fw_dir.name}", r"seed\d+"):
            manifest = _own(results, f"runs/{fw_dir.name}/{run.name}/manifest.json") or run / "manifest.json"
            found.append((run, read_manifest(manifest, ("framework", "seed", "run_id", "inputs", "config_hash"))))
    if not found:
        raise HarnessError(f"{results / 'runs'}: no run to bundle (runs/<framework>/seed<N> with a manifest.json)")
    return found


def _run_members(results: Path, run: Path, manifest: dict) -> dict[str, Member]:
    fw, seed = manifest["framework"], manifest["seed"]
    if run != layout.path(results, layout.RUN, framework=fw, seed=seed):
        raise HarnessError(f"{run}/manifest.json: records the run {fw} seed {seed}, which does not live here")
    rel_run, rel_metrics = layout.RUN.format(framework=fw, seed=seed), layout.METRICS.format(framework=fw, seed=seed)
    metrics = _own(results, rel_metrics)
    if metrics is None:
        raise HarnessError(f"{results / rel_metrics}: the run's metrics are missing (ingest the run before bundling)")
    members: dict[str, Member] = {rel_metrics: metrics}
    for name in RUN_RECORDS:
        path = _own(results, f"{rel_run}/{name}")
        if path is not None:
            members[f"{rel_run}/{name}"] = path
    return members


def _check_records(results: Path, manifests: list[dict]) -> None:
    """config.json and summary.csv are what a reader takes them for, checked before they are published: the
    effective config whose config_hash every run's manifest records, and a summary table."""
    from harness.results.summarize import read_summary  # pandas: when bundling only, not when opening

    path = results / layout.CONFIG
    config = validate_config(read_json_object(path, "effective config"), source=str(path))
    for m in manifests:
        if m["config_hash"] != config_hash(config):
            raise HarnessError(f"{path}: its config_hash is {config_hash(config)}, but the manifest of run "
                               f"{shown(str(m['run_id']))} records {shown(str(m['config_hash']))}: not the config the "
                               "runs ran with (bundle the results directory as the pipeline left it)")
    read_summary(results / layout.SUMMARY)


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
            raise HarnessError(f"manifest of {m['run_id']}: environment name {shown(name)} is not a file name")
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


def _input_record(inputs: Path | None, name: str, recorded: dict) -> dict:
    """bundle.json's record of one input: its sha256 and path as the runs recorded them, and whether the bundle
    holds it (not where it is, or holds, a link; `inputs` is None where results/inputs is one). A generated input in
    results/inputs must be the one the runs used: one rebuilt since would publish another experiment's inputs
    (HarnessError)."""
    out = {"sha256": recorded.get("sha256"), "path": recorded["path"], "bundled": False}
    if inputs is None or name not in INPUT_PLACES or not (inputs / INPUT_PLACES[name]).exists():
        return out  # the runs read their inputs elsewhere: nothing here to bundle
    place = inputs / INPUT_PLACES[name]
    linked = _has_link(place)  # the whole input: reward/ holds the reward model
    if recorded.get("kind") == "rule":  # the rule is code, pinned by the harness commit; reward.json says which
        return {**out, "kind": "rule", "bundled": not linked}
    if name == "reward":
        out["kind"] = recorded.get("kind")
        if recorded.get("kind") == "model":
            place = place / REWARD_MODEL
    if linked:
        return out
    actual = verify_hash(place) if place.name != REWARD_MODEL else sha256_tree(place)
    if actual != recorded.get("sha256"):
        raise HarnessError(f"{place}: sha256 {actual}, but the runs used {name} with sha256 {recorded.get('sha256')}:"
                           " the input was rebuilt after the runs; bundle the results the runs were made with")
    return {**out, "bundled": True}


def _tree(results: Path, rel: str) -> dict[str, Member]:
    """The regular, visible files at or under results/rel, by their path under `results`, none through a link
    (hidden ones are the harness's and Snakemake's markers, which sha256_tree leaves out of an input too)."""
    top = results / rel
    if top.is_file() and not top.is_symlink():
        return {rel: top}
    found: dict[str, Member] = {}
    for folder, dirs, files in os.walk(top):  # links to folders are listed in dirs, and not walked into
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for f in sorted(files):
            path = Path(folder, f)
            if not f.startswith(".") and path.is_file() and not path.is_symlink():
                found[path.relative_to(results).as_posix()] = path
    return found


def _inputs(results: Path, manifests: list[dict]) -> tuple[dict, dict[str, Member]]:
    """bundle.json's "inputs", and the inputs' own files to bundle: INPUT_RECORDS, and the files of each input the
    bundle holds. An inputs/ that is a link is not the results directory's: none of it is bundled."""
    recorded: dict[str, tuple[dict, str]] = {}
    for m in manifests:
        for name, rec in m["inputs"].items():
            first, by = recorded.setdefault(name, (rec, m["run_id"]))
            if first.get("sha256") != rec.get("sha256"):
                raise HarnessError(f"{results}: runs {by} and {m['run_id']} used different {name} inputs (sha256 "
                                   f"{first.get('sha256')} and {rec.get('sha256')}): not one comparison")
    inputs = None if (results / layout.INPUTS).is_symlink() else results / layout.INPUTS
    members: dict[str, Member] = {}
    for rel in (f"{layout.INPUTS}/{name}" for name in INPUT_RECORDS) if inputs else ():
        path = _own(results, rel)  # before verify_hash reads a sidecar: a link is refused, not followed
        if path is not None:
            members[rel] = path
    records = {name: _input_record(inputs, name, rec) for name, (rec, _) in sorted(recorded.items())}
    for name, record in records.items():
        if record["bundled"]:
            members.update(_tree(results, f"{layout.INPUTS}/{INPUT_PLACES[name]}"))
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
            # content is results/<name>: opened from the results directory through no link
            with _open_own(content.parents[name.count("/")], name) as f:
                info.size = os.fstat(f.fileno()).st_size
                reader = _Hashing(f)
                tar.addfile(info, reader)
            files[name] = reader.hash.hexdigest()
        data = (json.dumps({**record, "files": files}, indent=2, sort_keys=True, allow_nan=False) + "\n").encode()
        info = tarfile.TarInfo(f"{TOP}/{RECORD}")
        info.mode, info.mtime, info.size = 0o644, mtime, len(data)
        tar.addfile(info, io.BytesIO(data))


def _check_sizes(members: dict[str, Member]) -> None:
    """A file or files past the caps of an opened bundle (harness.runs.unbundle) would make a bundle no one can
    open: refused before it is written."""
    sizes = {name: len(c) if isinstance(c, bytes) else c.stat().st_size for name, c in members.items()}
    name = max(sizes, key=lambda n: sizes[n])
    if sizes[name] > unbundle.MAX_ENTRY_BYTES:
        content = members[name]
        raise HarnessError(f"{content if isinstance(content, Path) else name}: {sizes[name]} bytes, past the cap on "
                           f"one file of an opened bundle ({unbundle.MAX_ENTRY_BYTES} bytes)")
    if sum(sizes.values()) > unbundle.MAX_BYTES:
        raise HarnessError(f"{sum(sizes.values())} bytes of files to bundle, past the cap on an opened bundle's "
                           f"files together ({unbundle.MAX_BYTES} bytes)")


def make_bundle(results_dir: str | Path, out: str | Path) -> dict:
    """Write the bundle of `results_dir` to `out` (a .tar.gz; never over anything but a bundle the harness wrote);
    {"path", "bytes", "runs", "files"}. HarnessError naming the path for a results directory without config.json,
    summary.csv or any run, a run without a readable manifest or metrics, a link among its records (the module's
    docstring), a config.json that is not the runs' effective config or a summary.csv that is not a summary table,
    inputs the runs did not use, files past the caps of an opened bundle."""
    results = Path(results_dir)
    members: dict[str, Member] = {}
    for name in (layout.CONFIG, layout.SUMMARY, layout.CONFORMANCE):
        path = _own(results, name)
        if path is None and name != layout.CONFORMANCE:
            raise HarnessError(f"{results / name}: missing; not a finished results directory (bundle one the "
                               "pipeline completed)")
        if path is not None:
            members[name] = path
    runs = _runs(results)
    manifests = [m for _, m in runs]
    _check_records(results, manifests)
    for run, manifest in runs:
        members.update(_run_members(results, run, manifest))
    inputs, input_files = _inputs(results, manifests)
    members.update(input_files)
    envs, env_of = _environments(manifests)
    members.update({f"environments/{name}.txt": "".join(f"{line}\n" for line in lines).encode()
                    for name, lines in envs.items()})
    _check_sizes(members)
    now = datetime.now(UTC)
    record = {"format": FORMAT, "created": now.isoformat(timespec="seconds"), "harness": _git(manifests),
              "runs": [{"framework": m["framework"], "seed": m["seed"], "run_id": m["run_id"], "environment": env}
                       for m, env in zip(manifests, env_of)],
              "inputs": inputs, "environments": envs}
    with atomic_path(out, role=BUNDLE_ROLE) as tmp:
        _write_tar(tmp, members, record, int(now.timestamp()))
    return {"path": str(out), "bytes": Path(out).stat().st_size, "runs": len(runs), "files": len(members) + 1}
