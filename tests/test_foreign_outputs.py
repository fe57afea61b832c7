"""No command overwrites a file it did not write (docs/design.md, "Nothing deleted"): every subcommand that takes
`--out FILE` (or writes a file of a fixed name into a folder it is given), pointed at a file of the user's, refuses
with exit 2 and one line naming it, and the file is as it was; pointed at its own earlier output, it replaces it, but
not a finished result the harness wrote in another role (a bundle over a summary: `--out` names a role)."""

from __future__ import annotations

import json

import pytest
from test_malformed_inputs import remax_bench
from test_regression import nights

MINE = "my own notes, not remax-bench's\n"


def writers(t: dict, tmp) -> dict:
    """name -> (the file it writes, its arguments). A results folder with a history for the receipt."""
    results = nights(tmp / "results", 2)
    return {
        "freeze-config": (tmp / "config.json", ["freeze-config", "--json", "{}", "--out", tmp / "config.json"]),
        "ingest": (tmp / "m.parquet", ["ingest", "reference", t["run"], "--out", tmp / "m.parquet"]),
        "summarize": (tmp / "s.csv", ["summarize", "--config", t["config"], "--metrics", t["metrics"],
                                      "--out", tmp / "s.csv"]),
        "inputs dataset": (tmp / "inputs" / "dataset.jsonl",
                           ["inputs", "dataset", "--config", t["config"], "--inputs", tmp / "inputs"]),
        "history append --receipt": (tmp / "receipt.json", ["history", "append", "--results", results,
                                                            "--receipt", tmp / "receipt.json"]),
        "preflight": (tmp / "preflight.md", ["preflight", "--config", t["config"], "--out", tmp / "preflight.md"]),
        # refused before the environment is built (minutes), so this costs nothing
        "env": (tmp / "python.txt", ["env", "reference-none", "--out", tmp / "python.txt"]),
        # the record `image` writes beside the image, which no argument names; refused before apptainer is called
        "image": (tmp / "verl.json", ["image", "verl", "--config", t["config"], "--out", tmp / "verl.sif"]),
    }


@pytest.mark.parametrize("name", ["freeze-config", "ingest", "summarize", "inputs dataset",
                                  "history append --receipt", "preflight", "env", "image"])
def test_out_on_a_file_of_the_users_is_refused_and_left_as_it_was(tiny, tmp_path, name):
    dest, argv = writers(tiny, tmp_path)[name]
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(MINE)
    rc, err = remax_bench(*argv)
    assert rc == 2 and "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.startswith("remax-bench ")]
    assert len(lines) == 1 and f"{dest}: an existing file that remax-bench did not write" in lines[0], err
    assert dest.read_text() == MINE


def test_a_rerun_replaces_the_file_it_wrote_and_not_one_edited_since(tiny, tmp_path):
    dest, argv = writers(tiny, tmp_path)["summarize"]
    for _ in range(2):
        assert remax_bench(*argv)[0] == 0
    dest.write_text(dest.read_text() + "# my note\n")
    rc, err = remax_bench(*argv)
    assert rc == 2 and "or that was changed since" in err and dest.read_text().endswith("# my note\n")
    written = json.loads((tmp_path / ".remax-bench-files.json").read_text())
    assert set(written) == {"s.csv"}  # what it recorded: the one file it wrote here


def test_a_report_rendered_again_keeps_a_file_the_user_added_to_it(tiny, tmp_path):
    """Replacing the harness's own report folder deleted a notes.txt added inside it, exit 0."""
    out = tmp_path / "report"
    argv = ["report", tiny["root"] / "results", "--out", out]
    assert remax_bench(*argv)[0] == 0
    assert remax_bench(*argv)[0] == 0  # its own report, as it made it: replaced
    (out / "notes.txt").write_text(MINE)
    rc, err = remax_bench(*argv)
    lines = [line for line in err.splitlines() if line.startswith("remax-bench ")]
    assert rc == 2 and "Traceback" not in err and len(lines) == 1, err
    assert "holds notes.txt, which remax-bench did not write there" in lines[0], err
    assert (out / "notes.txt").read_text() == MINE and (out / "index.html").is_file()


@pytest.mark.parametrize("stage, mine, kept_out", [("dataset", "dataset.jsonl.sha256", "dataset.jsonl"),
                                                    ("policy", "policy.build.json", "policy"),
                                                    ("policy", "policy.sha256", "policy")])
def test_an_input_stage_checks_all_its_outputs_before_it_writes_any(tiny, tmp_path, stage, mine, kept_out):
    """`inputs dataset` wrote dataset.jsonl and then refused the user's sidecar beside it; `inputs policy` trained and
    wrote the policy, then refused policy.build.json."""
    import shutil

    inputs = tmp_path / "inputs"
    inputs.mkdir()
    for name in ("dataset.jsonl", "dataset.jsonl.sha256"):  # what the policy stage reads
        if stage == "policy":
            shutil.copy(tiny["inputs"] / name, inputs / name)
    (inputs / mine).write_text(MINE)
    rc, err = remax_bench("inputs", stage, "--config", tiny["config"], "--inputs", inputs)
    lines = [line for line in err.splitlines() if line.startswith("remax-bench ")]
    assert rc == 2 and "Traceback" not in err and len(lines) == 1, err
    assert f"{inputs / mine}: an existing file that remax-bench did not write" in lines[0], err
    assert (inputs / mine).read_text() == MINE and not (inputs / kept_out).exists()


@pytest.fixture
def finished(tiny, tmp_path):
    """A copy of the tiny finished results folder, the harness's records of what it wrote included: the commands
    below are pointed at its files, and `tiny` itself is never written into."""
    import shutil

    results = tmp_path / "results"
    shutil.copytree(tiny["root"] / "results", results, symlinks=True)
    return results


RUN = "runs/reference/seed1"
# Issue #61: each of these exited 0 and destroyed a finished result. command -> (its arguments given the results
# folder, the file it is pointed at, the role that file holds, the role of the command's write).
OTHER_ROLES = {
    "bundle": (lambda r: ["bundle", r, "--out", r / "summary.csv"], "summary.csv", "summary", "a bundle"),
    "freeze-config": (lambda r: ["freeze-config", "--json", "{}", "--out", r / "summary.csv"], "summary.csv",
                      "summary", "an effective config"),
    "ingest": (lambda r: ["ingest", "reference", r / RUN, "--out", r / RUN / "manifest.json"], f"{RUN}/manifest.json",
               "run manifest", "a metrics file"),
}


@pytest.mark.parametrize("name", sorted(OTHER_ROLES))
def test_out_on_a_finished_result_of_another_role_is_refused_naming_both_roles(finished, name):
    argv, rel, held, writing = OTHER_ROLES[name]
    dest = finished / rel
    before = dest.read_bytes()
    rc, err = remax_bench(*argv(finished))
    lines = [line for line in err.splitlines() if line.startswith("remax-bench ")]
    assert rc == 2 and "Traceback" not in err and len(lines) == 1, err
    assert f"{dest}: the {held} remax-bench wrote; refusing to replace it with {writing} (nothing was changed)" \
        in lines[0], err
    assert dest.read_bytes() == before
