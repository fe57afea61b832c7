import pytest

from harness import HarnessError
from harness.io import atomic_path, record_hash, verify_hash, write_text


def test_atomic_path_leaves_nothing_when_the_writer_fails(tmp_path):
    dest = tmp_path / "run"
    with pytest.raises(RuntimeError), atomic_path(dest) as tmp:
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
    with pytest.raises(HarnessError, match=r"dataset\.jsonl: input is missing"):
        verify_hash(tmp_path / "dataset.jsonl")
    write_text(tmp_path / "dataset.jsonl", "{}\n")
    with pytest.raises(HarnessError, match=r"dataset\.jsonl\.sha256: no recorded sha256"):
        verify_hash(tmp_path / "dataset.jsonl")


def test_an_external_checkpoint_is_linked_and_hashed_like_a_built_policy(tmp_path):
    from harness.config import validate_config
    from harness.inputs import build_policy

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text("{}")
    inputs = tmp_path / "inputs"
    digest = build_policy(validate_config({"policy": {"path": str(ckpt)}}), inputs)
    assert (inputs / "policy").is_symlink() and verify_hash(inputs / "policy") == digest
    (ckpt / "config.json").write_text('{"changed": 1}')
    with pytest.raises(HarnessError, match="sha256 mismatch"):
        verify_hash(inputs / "policy")
    with pytest.raises(HarnessError, match=r"at policy.path: .* \(no config.json\)"):
        build_policy(validate_config({"policy": {"path": str(tmp_path)}}), inputs)
