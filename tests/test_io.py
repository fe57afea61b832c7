import pytest

from harness import HarnessError
from harness.io import (
    OWNER,
    atomic_path,
    check_replaceable,
    read_json_object,
    read_jsonl,
    record_hash,
    verify_hash,
    write_json,
    write_text,
)

RUN = {"kind": "run", "framework": "reference", "seed": 1}


def test_atomic_path_leaves_nothing_when_the_writer_fails(tmp_path):
    dest = tmp_path / "run"
    with pytest.raises(RuntimeError), atomic_path(dest, owner=RUN) as tmp:
        tmp.mkdir()
        (tmp / "metrics.parquet").write_text("half")
        raise RuntimeError("killed mid-run")
    assert list(tmp_path.iterdir()) == []


def test_a_rerun_replaces_its_own_directory_whole(tmp_path):
    dest = tmp_path / "run"
    for content in ("old", "new"):
        with atomic_path(dest, owner=RUN) as tmp:
            tmp.mkdir()
            (tmp / content).write_text("x")
    assert sorted(p.name for p in dest.iterdir()) == [OWNER, "new"]


@pytest.mark.parametrize("made_as", [None, {**RUN, "seed": 2}, {**RUN, "kind": "plan"}],
                         ids=["results folder with history", "another seed's run", "a plan"])
def test_a_folder_the_harness_did_not_make_as_this_very_thing_is_never_replaced(tmp_path, made_as):
    dest = tmp_path / "results"
    if made_as is None:
        (dest / "history").mkdir(parents=True)
        (dest / "history" / "cpu.jsonl").write_text("15 nights\n")
    else:
        with atomic_path(dest, owner=made_as) as tmp:
            tmp.mkdir()
            (tmp / "metrics.parquet").write_text("a real run's")
    before = sorted(p.relative_to(dest) for p in dest.rglob("*"))
    with pytest.raises(HarnessError, match=rf"{dest}: an existing folder that is not the kind run framework "
                                           "reference seed 1 made by remax-bench; .*nothing was deleted"), \
            atomic_path(dest, owner=RUN) as tmp:
        tmp.mkdir()
    with pytest.raises(HarnessError, match="an existing folder; refusing to replace it with a file"), \
            atomic_path(dest, role="summary") as tmp:
        tmp.write_text("a file over a folder")
    assert sorted(p.relative_to(dest) for p in dest.rglob("*")) == before
    assert [p.name for p in tmp_path.iterdir()] == ["results"]  # no temporary left behind


def test_an_empty_folder_or_a_file_may_be_written_over(tmp_path):
    (tmp_path / "empty").mkdir()
    with atomic_path(tmp_path / "empty", owner=RUN) as tmp:
        tmp.mkdir()
    write_text(tmp_path / "summary.csv", "old", role="summary")
    write_text(tmp_path / "summary.csv", "new", role="summary")
    assert (tmp_path / "summary.csv").read_text() == "new"
    with pytest.raises(HarnessError, match="an existing file; refusing to replace it with a folder"):
        check_replaceable(tmp_path / "summary.csv", RUN)


def test_nan_and_infinity_in_json_are_bad_input_naming_the_file_and_line(tmp_path):
    (tmp_path / "a.json").write_text('{"tokens_per_s": NaN}')
    with pytest.raises(HarnessError, match=r"a\.json: manifest is not valid JSON \(NaN is not a number"):
        read_json_object(tmp_path / "a.json", "manifest")
    (tmp_path / "b.jsonl").write_text('{"x": 1}\n{"x": -Infinity}\n')
    with pytest.raises(HarnessError, match=r"b\.jsonl:2: not valid JSON \(-Infinity is not a number"):
        list(read_jsonl(tmp_path / "b.jsonl"))
    with pytest.raises(ValueError, match="Out of range float values are not JSON compliant"):
        write_json(tmp_path / "c.json", {"x": float("nan")}, role="record")  # never written, so never read back
    assert not (tmp_path / "c.json").exists()


def test_changed_input_is_caught_by_its_recorded_sha256(tmp_path):
    model = tmp_path / "policy"
    model.mkdir()
    write_text(model / "model.safetensors", "weights", role="weights")
    digest = record_hash(model)
    (model / ".snakemake_timestamp").write_text("")  # workflow markers are not part of the input
    assert verify_hash(model) == digest
    write_text(model / "model.safetensors", "weightz", role="weights")
    with pytest.raises(HarnessError, match=r"policy: sha256 mismatch \(recorded in .*policy.sha256"):
        verify_hash(model)


def test_missing_input_and_missing_record_are_named(tmp_path):
    with pytest.raises(HarnessError, match=r"dataset\.jsonl: input is missing"):
        verify_hash(tmp_path / "dataset.jsonl")
    write_text(tmp_path / "dataset.jsonl", "{}\n", role="dataset")
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


def test_a_file_is_replaced_only_while_it_is_what_the_harness_wrote_there(tmp_path):
    mine = tmp_path / "notes.csv"
    mine.write_text("my own table")
    with pytest.raises(HarnessError, match=r"notes\.csv: an existing file that remax-bench did not write"):
        write_text(mine, "a summary", role="summary")
    assert mine.read_text() == "my own table"
    write_text(tmp_path / "summary.csv", "first", role="summary")
    write_text(tmp_path / "summary.csv", "second", role="summary")  # a rerun
    (tmp_path / "summary.csv").write_text("second, edited by hand")
    with pytest.raises(HarnessError, match="or that was changed since"):
        write_text(tmp_path / "summary.csv", "third", role="summary")
    assert (tmp_path / "summary.csv").read_text() == "second, edited by hand"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".summary.csv.")]  # no temporary left


def _write_one(args):
    folder, name = args
    write_text(f"{folder}/{name}", name, role="metrics file")


def test_parallel_writers_into_one_folder_keep_every_record(tmp_path):
    """Snakemake's jobs write into one folder at once (metrics/<framework>/seedN.parquet): each file's record must
    survive the others' updates, or a rerun of that job would be refused."""
    import multiprocessing

    names = [f"seed{i}.parquet" for i in range(16)]
    with multiprocessing.get_context("fork").Pool(8) as pool:
        pool.map(_write_one, [(str(tmp_path), n) for n in names])
    for name in names:
        write_text(tmp_path / name, "rerun", role="metrics file")


def test_deep_non_finite_and_oversized_documents_are_refused_naming_the_file(tmp_path):
    from harness.io import MAX_DEPTH, read_document

    cases = {
        "deep.json": ("[" * 20_000 + "]" * 20_000, "nested too deep to read"),
        "deep-but-parsable.json": ("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1), f"nested more than {MAX_DEPTH} deep"),
        "deep.yaml": ("a: " + "[" * 20_000 + "]" * 20_000, "nested too deep to read"),
        "big.json": ('{"a": 1e999}', "1e999 is not a finite number"),
        "nan.yaml": ("lr: .nan\n", "at lr: nan is not a finite number"),
        "huge.json": ('{"step": ' + "9" * 5000 + "}", "not valid JSON: Exceeds the limit"),
        "wide.json": ('{"step": ' + "9" * 30 + "}", "at step: 9+ does not fit in 64 bits"),
        "alias.yaml": ("a: &x [1]\nb: *x\n", "line 2: a YAML alias"),
        "bytes.json": (b'{"a": "\xff"}', "not valid JSON"),
    }
    for name, (text, message) in cases.items():
        path = tmp_path / name
        path.write_bytes(text if isinstance(text, bytes) else text.encode())
        with pytest.raises(HarnessError, match=message) as refused:
            read_document(path, "record")
        assert str(refused.value).startswith(str(path)), refused.value
    (tmp_path / "large.json").write_text("[" + "0," * 600_000 + "0]")
    with pytest.raises(HarnessError, match=r"large\.json: larger than 1000000 bytes; not a record"):
        read_document(tmp_path / "large.json", "record", max_bytes=1_000_000)


def test_a_log_line_past_the_bound_is_refused_naming_the_line(tmp_path, monkeypatch):
    from harness import reading as io

    monkeypatch.setattr(io, "MAX_LINE_BYTES", 1000)  # the bound is 16 Mi characters; the rule is the same
    log = tmp_path / "console.log"
    log.write_text("step 1\r50%\r100%\n" + "x" * 1001 + "\nstep 3\n")
    lines = io.text_lines(log)
    assert [next(lines), next(lines), next(lines)] == [(1, "step 1\n"), (2, "50%\n"), (3, "100%\n")]
    with pytest.raises(HarnessError, match=r"console\.log:4: a line longer than 1000 bytes"):
        next(lines)
    log.write_bytes(b"ok\n\xff\xfe\n")
    with pytest.raises(HarnessError, match=r"console\.log:2: not UTF-8 text"):
        list(io.text_lines(log))
    assert [line for _, line in io.text_lines(log, errors="replace")][1] == "\ufffd\ufffd\n"


def test_a_folder_the_harness_made_is_not_replaced_while_it_holds_a_file_it_did_not_write_there(tmp_path):
    """Its OWNER lists the files it was made with; a file added since (the user's notes) stops a rerun, naming it,
    but a file the harness wrote into it since, Snakemake's marker, and an old OWNER without the list do not."""
    import json

    dest = tmp_path / "run"
    with atomic_path(dest, owner=RUN) as tmp:
        (tmp / "logs").mkdir(parents=True)
        (tmp / "logs" / "console.log").write_text("step 1\n")
        (tmp / "link").symlink_to(tmp_path / "elsewhere")
    assert json.loads((dest / OWNER).read_text()) == {**RUN, "files": ["link", "logs/console.log"]}
    write_text(dest / "metrics.parquet", "steps", role="metrics file")  # written into a run after it is made
    (dest / ".snakemake_timestamp").write_text("")
    check_replaceable(dest, RUN)
    (dest / "logs" / "notes.txt").write_text("my notes")
    with pytest.raises(HarnessError, match=rf"{dest}: the kind run .* holds logs/notes\.txt, which remax-bench did "
                                           r"not write there; .*nothing was deleted"), atomic_path(dest, RUN) as tmp:
        tmp.mkdir()
    assert (dest / "logs" / "notes.txt").read_text() == "my notes" and (dest / "metrics.parquet").is_file()
    (dest / OWNER).write_text(json.dumps(RUN))  # an OWNER written before the list: replaced as before
    check_replaceable(dest, RUN)


def test_a_file_is_replaced_only_by_a_write_in_the_role_it_was_written_in(tmp_path):
    """Issue #61: `--out` names a role: a bundle, an effective config or metrics written over a finished summary
    destroyed it, exit 0. WRITTEN records each file's role beside its sha256."""
    import json

    from harness.io import WRITTEN, sha256_file

    summary = tmp_path / "summary.csv"
    write_text(summary, "first", role="summary")
    write_text(summary, "second", role="summary")  # a rerun of the same stage
    with pytest.raises(HarnessError, match=rf"^{summary}: the summary remax-bench wrote; refusing to replace it with "
                                           r"a bundle \(nothing was changed\)"):
        write_text(summary, "a tar", role="bundle")
    with pytest.raises(HarnessError, match="the summary remax-bench wrote; refusing to replace it with an effective "
                                           "config"):
        check_replaceable(summary, role="effective config")
    assert summary.read_text() == "second"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".summary.csv.")]  # no temporary left
    assert json.loads((tmp_path / WRITTEN).read_text()) == {"summary.csv": {"role": "summary",
                                                                           "sha256": sha256_file(summary)}}
    summary.write_text("second, edited by hand")
    with pytest.raises(HarnessError, match="or that was changed since"):
        write_text(summary, "third", role="summary")  # its own role, but no longer what it wrote
    assert summary.read_text() == "second, edited by hand"


def test_a_file_recorded_before_roles_is_replaced_by_any_write_while_unchanged(tmp_path):
    """A WRITTEN entry that is a plain sha256 (no role yet) is treated as an OWNER without a file list is."""
    import json

    from harness.io import WRITTEN, sha256_file

    summary = tmp_path / "summary.csv"
    summary.write_text("an old summary")
    (tmp_path / WRITTEN).write_text(json.dumps({summary.name: sha256_file(summary)}))
    write_text(summary, "a bundle now", role="bundle")
    assert summary.read_text() == "a bundle now"
    with pytest.raises(HarnessError, match="the bundle remax-bench wrote; refusing to replace it with a summary"):
        write_text(summary, "a summary", role="summary")  # recorded with its role from now on


def test_an_oversized_sha256_sidecar_is_refused_naming_it_before_it_is_read_whole(tmp_path):
    """A sidecar is one sha256sum line; a 40 MB one cost `bundle` 980 MB of memory."""
    from harness.io import MAX_SIDECAR_BYTES, sha256_file, sidecar

    dataset = tmp_path / "dataset.jsonl"
    dataset.write_text("{}\n")
    line = f"{sha256_file(dataset)}  dataset.jsonl\n"
    sidecar(dataset).write_text(line)
    assert verify_hash(dataset) == sha256_file(dataset)
    sidecar(dataset).write_text(line + "#" * MAX_SIDECAR_BYTES)
    with pytest.raises(HarnessError, match=rf"^{sidecar(dataset)}: larger than {MAX_SIDECAR_BYTES} bytes; not a "
                                           "sha256 record"):
        verify_hash(dataset)
