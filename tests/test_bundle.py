"""`remax-bench bundle` and `unbundle` (harness/runs/bundle.py, unbundle.py): a finished comparison as one file, opened
on another machine only when every entry is a plain file of the bundle within its caps and every sha256 matches;
refused otherwise (exit 2), naming the entry, with nothing written."""

import gzip
import hashlib
import io
import json
import os
import re
import shutil
import tarfile
from pathlib import Path

import pytest
from conftest import run_cli
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness import HarnessError
from harness.inputs import resolve_inputs
from harness.runs import unbundle
from harness.runs.bundle import make_bundle
from harness.runs.unbundle import TOP, open_bundle


@pytest.fixture(scope="module")
def made(tiny, tmp_path_factory):
    """The tiny run's results bundled by the real CLI, and what it printed."""
    out = tmp_path_factory.mktemp("bundle") / "tiny.tar.gz"
    proc = run_cli("bundle", tiny["root"] / "results", "--out", out)
    assert proc.returncode == 0, proc.stderr
    return {"path": out, "stdout": proc.stdout, "results": tiny["root"] / "results"}


def _entries(path: Path) -> dict[str, bytes]:
    with tarfile.open(path, "r:gz") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar if m.isfile()}


def _write(path: Path, entries: dict[str, bytes], extra: list[tarfile.TarInfo] = (), mode: str = "w:gz") -> Path:
    with tarfile.open(path, mode) as tar:
        for name, data in entries.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for info in extra:
            tar.addfile(info)
    return path


def _listing(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def test_the_bundle_holds_the_comparison_and_opens_byte_equal(made, tmp_path):
    assert re.fullmatch(rf"remax-bench bundle: \S+ -> {re.escape(str(made['path']))}: 1 runs, 19 files, "
                        r"\d+\.\d (kB|MB)\n", made["stdout"]), made["stdout"]
    names = set(_entries(made["path"]))
    assert all(n.startswith(f"{TOP}/") for n in names)
    # The raw log and the run's own parquet copy stay out; hidden records of the harness too.
    assert not any(n.endswith(("steps.jsonl", "seed1/metrics.parquet")) or "/." in n for n in names)

    proc = run_cli("unbundle", made["path"], "--out", tmp_path / "opened")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"remax-bench unbundle: {made['path']} -> {tmp_path / 'opened'}: 1 runs, 19 files, every " \
                          "sha256 as bundle.json records\n"
    opened, results = tmp_path / "opened", made["results"]
    record = json.loads((opened / "bundle.json").read_text())
    files = sorted(str(p.relative_to(opened)) for p in opened.rglob("*") if p.is_file())
    assert files == sorted([*record["files"], "bundle.json", ".remax-bench.json"])
    for rel in record["files"]:
        if not rel.startswith("environments/"):
            assert (opened / rel).read_bytes() == (results / rel).read_bytes(), rel
    for rel in ("config.json", "summary.csv", "runs/reference/seed1/manifest.json", "runs/reference/seed1/eval.json",
                "metrics/reference/seed1.parquet", "inputs/dataset.jsonl", "inputs/policy/model.safetensors",
                "inputs/policy.sha256", "inputs/reward/reward.json"):
        assert rel in record["files"], rel

    manifest = json.loads((results / "runs/reference/seed1/manifest.json").read_text())
    assert record["harness"] == manifest["git"]
    assert record["runs"] == [{"framework": "reference", "seed": 1, "run_id": manifest["run_id"],
                               "environment": "harness"}]
    assert (opened / "environments/harness.txt").read_text().splitlines() == \
        [f"{k}=={v}" for k, v in sorted(manifest["versions"].items())]
    # The opened inputs are the ones the run used: the reader rebuilds nothing.
    now = resolve_inputs(opened / "inputs")
    for name, rec in manifest["inputs"].items():
        assert now[name]["sha256"] == rec["sha256"] == record["inputs"][name]["sha256"], name
        assert record["inputs"][name]["bundled"] is True


def test_a_checkpoint_of_the_users_is_recorded_not_bundled(made, tmp_path):
    results = tmp_path / "results"
    shutil.copytree(made["results"], results, symlinks=True)
    policy = results / "inputs" / "policy"
    shutil.move(policy, tmp_path / "my-checkpoint")
    policy.symlink_to(tmp_path / "my-checkpoint", target_is_directory=True)
    record = make_bundle(results, tmp_path / "b.tar.gz")
    assert record["files"] == 13  # the policy's 6 files are not in it
    names = _entries(tmp_path / "b.tar.gz")
    assert not any("/inputs/policy/" in n for n in names) and f"{TOP}/inputs/policy.sha256" in names
    listed = json.loads(names[f"{TOP}/bundle.json"])["inputs"]
    manifest = json.loads((results / "runs/reference/seed1/manifest.json").read_text())
    assert listed["policy"] == {"bundled": False, **manifest["inputs"]["policy"]}
    assert listed["dataset"]["bundled"] is True


def _results_copy(made, tmp_path) -> Path:
    results = tmp_path / "results"
    shutil.copytree(made["results"], results)
    return results


@pytest.mark.parametrize("damage, named", [
    (lambda r: (r / "summary.csv").unlink(), "summary.csv: missing"),
    (lambda r: (r / "config.json").unlink(), "config.json: missing"),
    (lambda r: shutil.rmtree(r / "runs"), "no run to bundle"),
    (lambda r: (r / "runs/reference/seed1/manifest.json").unlink(), "seed1/manifest.json: manifest not found"),
    (lambda r: (r / "runs/reference/seed1/manifest.json").write_text("{"), "seed1/manifest.json: manifest is not"),
    (lambda r: (r / "metrics/reference/seed1.parquet").unlink(), "seed1.parquet: the run's metrics are missing"),
    (lambda r: (r / "inputs/dataset.jsonl").write_text("{}\n"), "dataset.jsonl: sha256 mismatch"),
])
def test_a_results_directory_that_is_not_a_finished_comparison_is_refused(made, tmp_path, damage, named):
    results = _results_copy(made, tmp_path)
    damage(results)
    proc = run_cli("bundle", results, "--out", tmp_path / "b.tar.gz")
    assert proc.returncode == 2 and named in proc.stderr and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert not (tmp_path / "b.tar.gz").exists()


def test_a_file_of_the_users_is_not_overwritten(made, tmp_path):
    (tmp_path / "mine.tar.gz").write_text("mine")
    proc = run_cli("bundle", made["results"], "--out", tmp_path / "mine.tar.gz")
    assert proc.returncode == 2 and "did not write" in proc.stderr
    assert (tmp_path / "mine.tar.gz").read_text() == "mine"


def _info(name: str, kind: bytes, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, link
    return info


def _bad_bundles(good: dict[str, bytes]):
    """(name, a function making the bad bundle at a path from the good one's entries, what the refusal names)."""
    record = f"{TOP}/bundle.json"
    summary = f"{TOP}/summary.csv"
    without = {k: v for k, v in good.items() if k != f"{TOP}/metrics/reference/seed1.parquet"}
    return [
        ("dotdot", lambda p: _write(p, {**good, "../evil": b"x"}), "'../evil'"),
        ("dotdot-inside", lambda p: _write(p, {**good, f"{TOP}/../../evil": b"x"}), f"'{TOP}/../../evil'"),
        ("absolute", lambda p: _write(p, {**good, "/tmp/evil": b"x"}), "'/tmp/evil'"),
        ("outside-top", lambda p: _write(p, {**good, "other/x": b"x"}), "'other/x'"),
        ("symlink", lambda p: _write(p, good, [_info(f"{TOP}/link", tarfile.SYMTYPE, "/etc/passwd")]),
         f"'{TOP}/link': a link"),
        ("hardlink", lambda p: _write(p, good, [_info(f"{TOP}/hard", tarfile.LNKTYPE, summary)]),
         f"'{TOP}/hard': a link"),
        ("fifo", lambda p: _write(p, good, [_info(f"{TOP}/fifo", tarfile.FIFOTYPE)]), "a device or fifo"),
        ("device", lambda p: _write(p, good, [_info(f"{TOP}/dev", tarfile.CHRTYPE)]), "a device or fifo"),
        ("no-record", lambda p: _write(p, {k: v for k, v in good.items() if k != record}), "bundle.json is missing"),
        ("tampered", lambda p: _write(p, {**good, summary: good[summary] + b"x"}),
         f"'{TOP}/summary.csv': sha256"),
        ("truncated-listing", lambda p: _write(p, without), "seed1.parquet': listed in bundle.json but not in"),
        ("unlisted", lambda p: _write(p, {**good, f"{TOP}/runs/reference/seed1/extra.json": b"{}"}),
         "extra.json': in the bundle but not listed"),
        ("hidden", lambda p: _write(p, {**good, f"{TOP}/.remax-bench.json": b"{}"}), "a hidden file"),
        ("twice", lambda p: _write(p, {**good, f"{TOP}/config.json": b"{}"}, [_info(f"{TOP}/config.json",
                                                                                    tarfile.REGTYPE)]), "twice"),
        ("not-gzip", lambda p: _write(p, good, mode="w"), "not a whole gzip tar"),
        ("not-a-tar", lambda p: p.write_bytes(b"not a tar at all" * 100), "not a whole gzip tar"),
        ("bad-record", lambda p: _write(p, {**good, record: b"[1, 2"}), "bundle.json: not valid JSON"),
    ]


def _cases():
    return [case[0] for case in _bad_bundles({})] + ["cut-short"]


@pytest.mark.parametrize("case", _cases())
def test_a_bad_bundle_is_refused_naming_the_entry_and_nothing_is_written(made, tmp_path, case):
    good = _entries(made["path"])
    bad = tmp_path / "in" / "bad.tar.gz"
    bad.parent.mkdir()
    if case == "cut-short":
        data = made["path"].read_bytes()
        bad.write_bytes(data[:len(data) // 2])
        named = "not a whole gzip tar"
    else:
        _, build, named = next(c for c in _bad_bundles(good) if c[0] == case)
        build(bad)
    out = tmp_path / "out"
    out.mkdir()
    before = _listing(tmp_path)
    proc = run_cli("unbundle", bad, "--out", out / "opened")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert named in proc.stderr and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert _listing(tmp_path) == before  # nothing outside --out, nor --out itself


def test_past_the_bounds_is_refused(made, tmp_path, monkeypatch):
    monkeypatch.setattr(unbundle, "MAX_MEMBERS", 5)
    with pytest.raises(HarnessError, match="more than 5 entries"):
        open_bundle(made["path"], tmp_path / "a")
    monkeypatch.setattr(unbundle, "MAX_MEMBERS", 100)
    monkeypatch.setattr(unbundle, "MAX_BYTES", 10_000)
    with pytest.raises(HarnessError, match="more than 10000 bytes of files in all"):
        open_bundle(made["path"], tmp_path / "b")
    monkeypatch.setattr(unbundle, "MAX_BYTES", 4 << 30)
    monkeypatch.setattr(unbundle, "MAX_ENTRY_BYTES", 10_000)  # the tiny run's policy weights are 12 kB
    with pytest.raises(HarnessError, match=rf"entry '{TOP}/[^']+': \d+ bytes, past the cap on one file of a bundle "
                                           r"\(10000 bytes\)"):
        open_bundle(made["path"], tmp_path / "c")
    assert _listing(tmp_path) == []


def test_a_bundle_past_the_caps_of_an_opened_one_is_not_written(made, tmp_path, monkeypatch):
    """What `bundle` writes, `unbundle` opens: files past its caps are refused before the bundle is written."""
    monkeypatch.setattr(unbundle, "MAX_ENTRY_BYTES", 10_000)
    with pytest.raises(HarnessError, match=r"seed1.parquet: \d+ bytes, past the cap on one file of an opened bundle"):
        make_bundle(made["results"], tmp_path / "b.tar.gz")
    monkeypatch.setattr(unbundle, "MAX_ENTRY_BYTES", 1 << 30)
    monkeypatch.setattr(unbundle, "MAX_BYTES", 10_000)
    with pytest.raises(HarnessError, match="bytes of files to bundle, past the cap on an opened bundle's files"):
        make_bundle(made["results"], tmp_path / "b.tar.gz")
    assert _listing(tmp_path) == []


def test_a_header_claiming_more_than_a_read_is_refused_before_it_is_read(made, tmp_path, monkeypatch):
    """A pax header (here a long name) is read into memory whole by tarfile: one past MAX_READ is refused unread."""
    monkeypatch.setattr(unbundle, "MAX_READ", 4096)
    bad = _write(tmp_path / "long.tar.gz", {f"{TOP}/{'x' * 5000}": b"x"})
    with pytest.raises(HarnessError, match="past the bounds of a bundle"):
        open_bundle(bad, tmp_path / "opened")
    assert _listing(tmp_path) == ["long.tar.gz"]


def test_an_existing_folder_is_replaced_only_when_it_is_an_opened_bundle(made, tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    with pytest.raises(HarnessError, match="not the kind bundle made by remax-bench"):
        open_bundle(made["path"], mine)
    assert _listing(mine) == ["notes.txt"]
    assert open_bundle(made["path"], tmp_path / "opened") == tmp_path / "opened"
    assert open_bundle(made["path"], tmp_path / "opened") == tmp_path / "opened"  # a bundle opened again over itself


class _Zeros(io.RawIOBase):
    """`n` zero bytes read as a file: a bomb streamed into the tar, never held or written whole."""

    def __init__(self, n: int):
        self.left = n

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        n = self.left if n < 0 else min(n, self.left)
        self.left -= n
        return bytes(n)


def test_a_gzip_bomb_is_refused_early_naming_the_entry_and_the_cap(made, tmp_path):
    """Issue #61: 1 GiB of zeros, about 1 MB gzipped and listed with its true sha256 in bundle.json, was opened to
    1.1 GB. The compression-ratio cap stops it past RATIO_FLOOR, long before the other caps would."""
    good = _entries(made["path"])
    record = json.loads(good.pop(f"{TOP}/bundle.json"))
    size, name, digest = 1 << 30, "inputs/zeros.bin", hashlib.sha256()
    for _ in range(size >> 20):
        digest.update(bytes(1 << 20))
    record["files"][name] = digest.hexdigest()
    bomb = tmp_path / "in" / "bomb.tar.gz"
    bomb.parent.mkdir()
    with tarfile.open(bomb, "w:gz") as tar:
        tar.copybufsize = 1 << 20
        good[f"{TOP}/bundle.json"] = json.dumps(record).encode()
        for entry, data in good.items():
            if entry.endswith("/bundle.json"):  # the bomb before it, as `bundle` writes bundle.json last
                info = tarfile.TarInfo(f"{TOP}/{name}")
                info.size = size
                tar.addfile(info, _Zeros(size))
            info = tarfile.TarInfo(entry)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    assert bomb.stat().st_size < 2 << 20
    (tmp_path / "out").mkdir()
    proc = run_cli("unbundle", bomb, "--out", tmp_path / "out" / "opened")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"entry '{TOP}/{name}': " in proc.stderr and f"more than {unbundle.MAX_RATIO} to 1 (the cap on a bundle's " \
        "compression ratio" in proc.stderr and proc.stderr.endswith("(nothing was extracted)\n"), proc.stderr
    assert int(re.search(r"(\d+) bytes decompressed from \d+", proc.stderr).group(1)) < 2 * unbundle.RATIO_FLOOR
    assert _listing(tmp_path / "out") == []


def _elsewhere(results: Path, rel: str, target: Path | None = None) -> Path:
    """results/rel made a link: to `target`, or to its own content moved beside the results directory."""
    if target is None:
        target = results.parent / "elsewhere" / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(results / rel, target)
    else:
        (results / rel).unlink()
    (results / rel).symlink_to(target)
    return target


def _bundle_of(results: Path, out: Path) -> tuple[dict[str, bytes], dict]:
    proc = run_cli("bundle", results, "--out", out)
    assert proc.returncode == 0, proc.stderr
    names = _entries(out)
    return names, json.loads(names[f"{TOP}/bundle.json"])


@pytest.mark.parametrize("rel", ["config.json", "summary.csv", "runs", "runs/reference", "runs/reference/seed1",
                                 "runs/reference/seed1/manifest.json", "runs/reference/seed1/eval.json",
                                 "metrics/reference", "metrics/reference/seed1.parquet", "inputs/policy.sha256",
                                 "inputs/policy.build.json"])
def test_a_link_among_the_runs_records_is_refused_naming_it(made, tmp_path, rel):
    """Issue #61: `bundle` followed links and published what they point to. A record of the comparison that is a
    link, or sits behind one, is refused: leaving it out would publish a broken bundle."""
    results = _results_copy(made, tmp_path)
    _elsewhere(results, rel)
    proc = run_cli("bundle", results, "--out", tmp_path / "b.tar.gz")
    assert proc.returncode == 2 and f"{results / rel}: a link (to " in proc.stderr, proc.stderr
    assert len(proc.stderr.splitlines()) == 1 and not (tmp_path / "b.tar.gz").exists()


def test_a_run_file_linked_to_a_system_file_is_refused(made, tmp_path):
    results = _results_copy(made, tmp_path)
    _elsewhere(results, "runs/reference/seed1/eval.json", Path("/etc/passwd"))
    proc = run_cli("bundle", results, "--out", tmp_path / "b.tar.gz")
    assert proc.returncode == 2 and "seed1/eval.json: a link (to '/etc/passwd')" in proc.stderr, proc.stderr
    assert not (tmp_path / "b.tar.gz").exists()


def test_a_linked_inputs_folder_is_recorded_not_followed(made, tmp_path):
    """inputs/ that is a link lives elsewhere, as a user's checkpoint does: every input is recorded for the reader
    to supply, and nothing of the folder it points to (private.txt there) is bundled."""
    results = _results_copy(made, tmp_path)
    (_elsewhere(results, "inputs") / "private.txt").write_text("not the run's")
    names, record = _bundle_of(results, tmp_path / "b.tar.gz")
    assert not [n for n in names if n.startswith(f"{TOP}/inputs/")]
    assert {name: rec["bundled"] for name, rec in record["inputs"].items()} == dict.fromkeys(record["inputs"], False)


def test_only_the_inputs_own_files_are_bundled(made, tmp_path):
    """A file beside the inputs stays out, and an input holding a link (here the policy's weights) is recorded,
    with none of its files bundled, rather than bundled in part."""
    results = _results_copy(made, tmp_path)
    (results / "inputs" / "private.txt").write_text("not an input")
    (results / "inputs" / "notes").mkdir()
    (results / "inputs" / "notes" / "todo.txt").write_text("not an input")
    _elsewhere(results, "inputs/policy/model.safetensors")
    names, record = _bundle_of(results, tmp_path / "b.tar.gz")
    inputs = sorted(n.removeprefix(f"{TOP}/inputs/") for n in names if n.startswith(f"{TOP}/inputs/"))
    assert inputs == ["dataset.jsonl", "dataset.jsonl.sha256", "policy.build.json", "policy.sha256",
                      "reward.sha256", "reward/reward.json"]
    assert record["inputs"]["policy"]["bundled"] is False and record["inputs"]["dataset"]["bundled"] is True


def _other_config(results: Path) -> None:
    config = json.loads((results / "config.json").read_text())
    (results / "config.json").write_text(json.dumps({**config, "profile": "another"}))


@pytest.mark.parametrize("damage, named", [
    (lambda r: (r / "config.json").write_text('{"profile": 1}'), "config.json: invalid config"),
    (lambda r: (r / "config.json").write_text("[1, 2"), "config.json: effective config is not valid JSON"),
    (_other_config, "config.json: its config_hash is "),
    (lambda r: (r / "summary.csv").write_text("not,a\nsummary,table\n"), "summary.csv: lacks column(s) run_id"),
    (lambda r: (r / "summary.csv").write_text((r / "summary.csv").read_text()[:-40]), "summary.csv:2: not "),
])
def test_a_config_or_summary_that_is_not_the_comparisons_is_refused(made, tmp_path, damage, named):
    """Issue #61: `bundle` packed config.json and summary.csv unread. Now config.json must be the effective config
    every run's manifest hashes, and summary.csv a summary table."""
    results = _results_copy(made, tmp_path)
    damage(results)
    proc = run_cli("bundle", results, "--out", tmp_path / "b.tar.gz")
    assert proc.returncode == 2 and f"remax-bench bundle: error: {results}/{named}" in proc.stderr, proc.stderr
    assert not (tmp_path / "b.tar.gz").exists()


LONG = "x" * (1 << 20)


def _nul_named(path: Path, good: dict[str, bytes]) -> Path:
    """The good bundle and an entry whose name holds a NUL, which only a pax record can hold."""
    path.write_bytes(gzip.compress(_tar({**good, f"{TOP}/x": b"x"}, {f"{TOP}/x": {"path": f"{TOP}/a\0b"}})))
    return path


@pytest.mark.parametrize("build, named", [
    # repr() cut after 200 characters: the quote, then the name's first 199
    (lambda p, good: _write(p, {**good, f"../{LONG}": b"x"}),
     f"entry '../{LONG[:196]}... ({len(LONG) + 3} characters): "),
    (lambda p, good: _write(p, good, [_info(f"{TOP}/link", tarfile.SYMTYPE, LONG)]),
     f"a link (to '{LONG[:199]}... ({len(LONG)} characters)); "),
    (lambda p, good: _write(p, {**good, f"{TOP}/{LONG}": b"x"}),
     f"entry '{TOP}/{LONG[:180]}... ({len(TOP) + 1 + len(LONG)} characters) could not be written (File name too long)"),
    (lambda p, good: _write(p, {**good, f"{TOP}/a\n\x1b[2J": b"x"}), r"'remax-bench-bundle/a\n\x1b[2J': a control"),
    (lambda p, good: _nul_named(p, good), r"'remax-bench-bundle/a\x00b': a control"),
])
def test_a_name_from_a_bundle_is_shown_escaped_and_cut(made, tmp_path, build, named):
    """Issue #61: an entry's name (a megabyte of it) was echoed whole, and a NUL in one was a traceback; now each is
    shown as repr() (escaped: no control character reaches the terminal), cut after 200 characters."""
    bad = build(tmp_path / "bad.tar.gz", _entries(made["path"]))
    proc = run_cli("unbundle", bad, "--out", tmp_path / "opened")
    assert proc.returncode == 2 and named in proc.stderr and len(proc.stderr) < 1000, proc.stderr[:2000]
    assert "\x1b" not in proc.stderr and not (tmp_path / "opened").exists()


# The fields of a tar header (offset, width) a damage overwrites; the checksum is then made right again, so that
# tarfile reads the header and the opener sees what it says.
HEADER_FIELDS = {"name": (0, 100), "mode": (100, 8), "size": (124, 12), "type": (156, 1), "linkname": (157, 100),
                 "magic": (257, 8), "prefix": (345, 155)}
PAX_KEYS = ["path", "linkpath", "size", "uid", "mtime", "hdrcharset", "GNU.sparse.map", "GNU.sparse.size",
            "GNU.sparse.major", "GNU.sparse.minor", "GNU.sparse.realsize", "GNU.sparse.name", "GNU.sparse.offset"]


def _tar(entries: dict[str, bytes], pax: dict[str, dict[str, str]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in entries.items():
            info = tarfile.TarInfo(name)
            info.size, info.pax_headers = len(data), pax.get(name, {})
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@st.composite
def _damaged(draw: st.DrawFn, good: dict[str, bytes], headers: list[int]) -> bytes:
    """The good bundle with one damage: a header field, pax records, a run of bytes anywhere in the tar, or bytes of
    the gzip stream."""
    kind = draw(st.sampled_from(["header", "pax", "tar", "gzip"]))
    names = list(good)
    pax = {draw(st.sampled_from(names)): draw(st.dictionaries(st.sampled_from(PAX_KEYS), st.text(max_size=12),
                                                              min_size=1, max_size=3))} if kind == "pax" else {}
    tar = bytearray(_tar(good, pax))
    if kind == "header":
        at = draw(st.sampled_from(headers))
        offset, width = HEADER_FIELDS[draw(st.sampled_from(sorted(HEADER_FIELDS)))]
        value = draw(st.binary(min_size=1, max_size=width))
        tar[at + offset:at + offset + len(value)] = value
        tar[at + 148:at + 156] = b" " * 8
        tar[at + 148:at + 156] = b"%06o\0 " % sum(tar[at:at + 512])
    elif kind == "tar":
        at = draw(st.integers(min_value=0, max_value=len(tar) - 1))
        value = draw(st.binary(min_size=1, max_size=64))
        tar[at:at + len(value)] = value
    data = bytearray(gzip.compress(bytes(tar)))
    if kind == "gzip":
        at = draw(st.integers(min_value=0, max_value=len(data) - 1))
        data[at] ^= draw(st.integers(min_value=1, max_value=255))
        data = data[:draw(st.integers(min_value=1, max_value=len(data)))]
    return bytes(data)


def test_a_damaged_bundle_is_refused_with_a_harness_error_and_leaves_nothing(made, tmp_path):
    """Hypothesis: whatever the damage, opening a bundle opens it or raises HarnessError (exit 2), never another
    exception (a traceback, exit 3), and a refusal leaves no folder and no temporary beside it."""
    good = _entries(made["path"])
    with tarfile.open(fileobj=io.BytesIO(_tar(good, {}))) as tar:
        headers = [m.offset for m in tar]
    folder = tmp_path / "here"
    folder.mkdir()

    @settings(max_examples=200, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(_damaged(good, headers))
    def check(bad: bytes) -> None:
        (folder / "bad.tar.gz").write_bytes(bad)
        try:
            open_bundle(folder / "bad.tar.gz", folder / "opened")
        except HarnessError:
            assert not (folder / "opened").exists()
        else:
            shutil.rmtree(folder / "opened")  # a damage that left the bundle whole: the padding, a mode's digit
        assert os.listdir(folder) == ["bad.tar.gz"]

    check()
