import pytest

from harness import HarnessError
from harness.io import atomic_path, record_hash, verify_hash, write_text


def test_atomic_path_leaves_nothing_when_the_writer_fails(tmp_path):
    dest = tmp_path / "run"
    with pytest.raises(RuntimeError):
        with atomic_path(dest) as tmp:
            tmp.mkdir()
            (tmp / "metrics.parquet").write_text("half")
            raise RuntimeError("killed mid-run")
    assert list(tmp_path.iterdir()) == []


def test_atomic_path_replaces_an_old_directory_whole(tmp_path):
    dest = tmp_path / "run"
    dest.mkdir()
    (dest / "stale").write_text("old")
    with atomic_path(dest) as tmp:
        tmp.mkdir()
        (tmp / "new").write_text("x")
    assert [p.name for p in dest.iterdir()] == ["new"]


def test_changed_input_is_caught_by_its_recorded_sha256(tmp_path):
    model = tmp_path / "policy"
    model.mkdir()
    write_text(model / "model.safetensors", "weights")
    digest = record_hash(model)
    (model / ".snakemake_timestamp").write_text("")  # workflow markers are not part of the input
    assert verify_hash(model) == digest
    write_text(model / "model.safetensors", "weightz")
    with pytest.raises(HarnessError, match=r"policy: sha256 mismatch \(recorded in .*policy.sha256"):
        verify_hash(model)


def test_missing_input_and_missing_record_are_named(tmp_path):
    with pytest.raises(HarnessError, match="dataset.jsonl: input is missing"):
        verify_hash(tmp_path / "dataset.jsonl")
    write_text(tmp_path / "dataset.jsonl", "{}\n")
    with pytest.raises(HarnessError, match="dataset.jsonl.sha256: no recorded sha256"):
        verify_hash(tmp_path / "dataset.jsonl")
