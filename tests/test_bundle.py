"""`remax-bench bundle` and `unbundle` (harness/runs/bundle.py): a finished comparison as one file, opened on another
machine only when every entry is a plain file of the bundle and every sha256 matches; refused otherwise (exit 2),
naming the entry, with nothing written."""

import io
import json
import re
import shutil
import tarfile
from pathlib import Path

import pytest
from conftest import run_cli

from harness import HarnessError
from harness.inputs import resolve_inputs
from harness.runs import bundle
from harness.runs.bundle import TOP, make_bundle, open_bundle


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
         f"{TOP}/summary.csv: sha256"),
        ("truncated-listing", lambda p: _write(p, without), "seed1.parquet: listed in bundle.json but not in"),
        ("unlisted", lambda p: _write(p, {**good, f"{TOP}/runs/reference/seed1/extra.json": b"{}"}),
         "extra.json: in the bundle but not listed"),
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
    monkeypatch.setattr(bundle, "MAX_MEMBERS", 5)
    with pytest.raises(HarnessError, match="more than 5 entries"):
        open_bundle(made["path"], tmp_path / "a")
    monkeypatch.setattr(bundle, "MAX_MEMBERS", 100)
    monkeypatch.setattr(bundle, "MAX_BYTES", 10_000)
    with pytest.raises(HarnessError, match="more than 10000 bytes"):
        open_bundle(made["path"], tmp_path / "b")
    assert _listing(tmp_path) == []


def test_a_header_claiming_more_than_a_read_is_refused_before_it_is_read(made, tmp_path, monkeypatch):
    """A pax header (here a long name) is read into memory whole by tarfile: one past MAX_READ is refused unread."""
    monkeypatch.setattr(bundle, "MAX_READ", 4096)
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
