"""One meaning per exit code, for every subcommand (docs/design.md, "Exit codes"): 0 done, 1 only "regression found",
2 bad input or a problem of the machine, with one line naming the file; never a traceback for an expected failure.
And no command deletes what it did not make.

The faults are real: a read-only file system and a full one are real tmpfs mounts (root can mount them here; CI
runs as root), a results folder with history is one the pipeline's own code wrote.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import time

import pytest
from conftest import REPO, run_cli, snakemake
from test_history import make_results
from test_regression import nights

from harness import HarnessError
from harness.io import OWNER
from harness.results.layout import HISTORY


@contextlib.contextmanager
def tmpfs(path, *options):
    path.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", ",".join(("size=64k", *options)), "tmpfs", str(path)],
                          capture_output=True, text=True)
    if proc.returncode:
        pytest.skip(f"cannot mount a tmpfs here to make a real read-only or full disk: {proc.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=True)


def one_line_error(proc, *names):
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-1000:], proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("remax-bench ")]
    assert len(lines) == 1 and all(str(n) in lines[0] for n in names), proc.stderr


def writers(t, out):
    """Each subcommand that writes, with its output at `out` (a folder or file that cannot be written)."""
    return {
        "freeze-config": ["freeze-config", "--json", "{}", "--out", out / "config.json"],
        "inputs": ["inputs", "dataset", "--config", t["config"], "--inputs", out],
        "run": ["run", "reference", "--config", t["config"], "--seed", 1, "--out", out / "run",
                "--inputs", t["inputs"]],
        "ingest": ["ingest", "reference", t["run"], "--out", out / "m.parquet"],
        "summarize": ["summarize", "--config", t["config"], "--metrics", t["metrics"], "--out", out / "s.csv"],
        "report": ["report", t["root"] / "results", "--out", out / "report"],
    }


@pytest.mark.parametrize("fault", ["read-only", "full"])
def test_an_unwritable_or_full_disk_is_exit_2_with_one_line_for_every_writer(tiny, tmp_path, fault):
    big = tmp_path / "big"
    big.write_bytes(b"x" * (80 << 10))
    with tmpfs(tmp_path / "out", "ro" if fault == "read-only" else "rw") as out:
        if fault == "full":
            with contextlib.suppress(OSError):  # fill it to the last byte
                (out / "filler").write_bytes(big.read_bytes())
        for name, args in writers(tiny, out).items():
            proc = run_cli(*args)
            one_line_error(proc)
            assert str(out) in proc.stderr and ("Read-only file system" in proc.stderr
                                                or "No space left on device" in proc.stderr), (name, proc.stderr)


def test_history_append_baseline_and_check_on_a_read_only_disk_exit_2(tmp_path):
    results = nights(tmp_path / "results", 3)
    assert run_cli("baseline", "update", "--results", results, "--out", tmp_path / "cpu.json").returncode == 0
    make_results(results, created="2026-01-09T00:00:00+00:00")
    with tmpfs(tmp_path / "ro", "ro") as ro:
        one_line_error(run_cli("baseline", "update", "--results", results, "--out", ro / "b.json"), ro)
    with tmpfs(tmp_path / "ro2", "ro") as ro:
        proc = run_cli("history", "append", "--results", results, "--receipt", ro / "r.json")
        one_line_error(proc, ro)


def test_bad_values_in_a_baseline_are_exit_2_not_a_regression(tmp_path):
    results = nights(tmp_path / "results", 4)
    baseline = tmp_path / "cpu.json"
    assert run_cli("baseline", "update", "--results", results, "--out", baseline, "--last", 3).returncode == 0
    base = json.loads(baseline.read_text())
    fw = base["frameworks"]["reference"]
    for name, damage in {
        "a metric as text": lambda b: b["frameworks"]["reference"]["runs"][0]["metrics"].update(throughput="fast"),
        "a seed as text": lambda b: b["frameworks"]["reference"]["runs"][0].update(seed="one"),
        "metrics not an object": lambda b: b["frameworks"]["reference"]["runs"][1].update(metrics=[1, 2]),
        "reward target as text": lambda b: b["frameworks"]["reference"].update(reward_target="high"),
    }.items():
        bad = json.loads(json.dumps(base))
        damage(bad)
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(bad))
        proc = run_cli("check", "--baseline", path, "--results", results)
        one_line_error(proc, path)
    nan = tmp_path / "nan.json"
    nan.write_text(baseline.read_text().replace(f'"reward_target": {fw["reward_target"]}', '"reward_target": NaN'))
    assert "NaN" in nan.read_text()
    one_line_error(run_cli("check", "--baseline", nan, "--results", results), nan, "NaN is not a number")


def test_nan_or_infinity_in_the_history_is_exit_2_naming_the_line(tmp_path):
    results = nights(tmp_path / "results", 4)
    damaged = sorted((results / HISTORY).glob("*.jsonl"))[2]
    rows = damaged.read_text().splitlines()
    rows[1] = rows[1].replace('"throughput_tok_s": ', '"throughput_tok_s": Infinity, "x": ', 1)
    damaged.write_text("\n".join(rows) + "\n")
    one_line_error(run_cli("baseline", "update", "--results", results, "--out", tmp_path / "b.json"),
                   f"{damaged}:2", "Infinity is not a number")
    assert not (tmp_path / "b.json").exists()


def test_a_framework_log_with_nan_is_exit_2_naming_the_step(tiny, tmp_path):
    log = tmp_path / "run" / "steps.jsonl"
    log.parent.mkdir()
    lines = (tiny["run"] / "steps.jsonl").read_text().splitlines()
    row = json.loads(lines[1])
    lines[1] = json.dumps({**row, "time_step_s": float("inf")})  # as Python's json writes a broken timer's figure
    log.write_text("\n".join(lines) + "\n")
    one_line_error(run_cli("ingest", "reference", log, "--out", tmp_path / "m.parquet"), log)
    assert not (tmp_path / "m.parquet").exists()


def test_baseline_update_refuses_a_history_that_repeats_a_pipeline_run(tmp_path):
    results = nights(tmp_path / "results", 3)
    files = sorted((results / HISTORY).glob("*.jsonl"))
    (results / HISTORY / "copy.jsonl").write_text(files[1].read_text())  # a night's file copied back in
    proc = run_cli("baseline", "update", "--results", results, "--out", tmp_path / "b.json")
    one_line_error(proc, "the history repeats runs", files[1].name, "copy.jsonl")
    run = files[0].name.split("-")[1].removesuffix(".jsonl")
    proc = run_cli("baseline", "update", "--results", results, "--out", tmp_path / "b.json", "--runs", run, run,
                   files[2].name.split("-")[1].removesuffix(".jsonl"))
    assert proc.returncode == 2 and "named more than once" in proc.stderr


# ---- no command deletes what it did not make ----------------------------------------------------------------------

def test_run_out_on_a_results_folder_with_history_is_refused_and_deletes_nothing(tiny, tmp_path):
    results = nights(tmp_path / "results", 3)
    before = {p: p.read_bytes() for p in results.rglob("*") if p.is_file()}
    proc = run_cli("run", "reference", "--config", tiny["config"], "--seed", 1, "--out", results,
                   "--inputs", tiny["inputs"])
    one_line_error(proc, results, "refusing to replace it (nothing was deleted)")
    assert {p: p.read_bytes() for p in results.rglob("*") if p.is_file()} == before


@pytest.mark.parametrize("command", ["run", "plan", "launch"])
def test_out_on_a_folder_holding_a_stray_file_is_refused(tiny, tmp_path, command):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("my notes")
    args = {"run": ["run", "reference", "--config", tiny["config"], "--seed", 1, "--out", out,
                    "--inputs", tiny["inputs"]],
            "plan": ["plan", "dschat", "--config", tiny["config"], "--seed", 1, "--out", out,
                     "--inputs", tiny["inputs"]],
            "launch": ["launch", tiny["run"], "--config", tiny["config"], "--out", out, "--timeout-min", 1]}[command]
    if command == "launch":  # a plan directory to launch: launch.sh and plan.json
        plan = tmp_path / "plan"
        plan.mkdir()
        (plan / "launch.sh").write_text("exit 0\n")
        (plan / "plan.json").write_text(json.dumps({"framework": "verl", "framework_version": "0.9.1", "seed": 1,
                                                    "run_id": "verl-cpu-s1", "n_gpus": 1, "inputs": {}}))
        args[1] = plan
    start = time.monotonic()
    proc = run_cli(*args)
    one_line_error(proc, out, "refusing to replace it")
    assert (out / "notes.txt").read_text() == "my notes" and sorted(p.name for p in out.iterdir()) == ["notes.txt"]
    assert time.monotonic() - start < 60  # refused before the run, not after it


def test_a_rerun_replaces_its_own_run_and_only_that(tiny, tmp_path):
    run = tmp_path / "seed1"
    for _ in range(2):
        proc = run_cli("run", "reference", "--config", tiny["config"], "--seed", 1, "--out", run,
                       "--inputs", tiny["inputs"])
        assert proc.returncode == 0, proc.stderr
    mark = json.loads((run / OWNER).read_text())
    assert mark == {"kind": "run", "framework": "reference", "seed": 1, "files": mark["files"]} and mark["files"]
    proc = run_cli("run", "reference", "--config", tiny["config"], "--seed", 2, "--out", run,
                   "--inputs", tiny["inputs"])
    one_line_error(proc, run, "not the kind run framework reference seed 2")
    assert json.loads((run / "manifest.json").read_text())["seed"] == 1


# ---- bounded input -------------------------------------------------------------------------------------------------

# 9 levels of 9 aliases each: 9^9 strings once expanded, in under 400 bytes.
BOMB = 'a: &a ["x","x","x","x","x","x","x","x","x"]\n' + "".join(
    f"{name}: &{name} [{','.join(['*' + prev] * 9)}]\n" for prev, name in zip("abcdefgh", "bcdefghi"))


def test_a_yaml_alias_bomb_is_refused_at_once_by_the_cli_and_by_the_workflow(tmp_path):
    config = tmp_path / "bomb.yaml"
    config.write_text(BOMB)
    assert len(BOMB) < 400 and BOMB.count("*") == 72
    start = time.monotonic()
    proc = run_cli("inputs", "dataset", "--config", config, "--inputs", tmp_path / "inputs")
    one_line_error(proc, config, "line 2: a YAML alias")
    proc = snakemake(tmp_path, "-n", "--configfile", config)  # Snakemake loads it itself, keeping the aliases shared
    assert proc.returncode != 0 and "a YAML alias (*name) of a block used elsewhere" in proc.stdout + proc.stderr
    assert time.monotonic() - start < 60


def test_an_alias_bomb_is_refused_by_ab_and_in_the_reports_claims(tmp_path):
    """`ab --config` read its YAML with PyYAML's own loader (29 s, 2.4 GB, then MemoryError); so did the claims."""
    from harness.report.claims import load_claims

    config = tmp_path / "bomb.yaml"
    config.write_text(BOMB)
    start = time.monotonic()
    proc = run_cli("ab", "--a", "HEAD", "--b", "HEAD", "--config", config, "--out", tmp_path / "ab", cwd=REPO)
    one_line_error(proc, config, "line 2: a YAML alias")
    assert time.monotonic() - start < 30 and not (tmp_path / "ab").exists()
    with pytest.raises(HarnessError, match="line 2: a YAML alias"):
        load_claims(config)


def test_an_oversized_config_is_refused_before_it_is_parsed(tmp_path):
    config = tmp_path / "huge.yaml"
    config.write_text("profile: cpu\n" + "# padding\n" * 200_000)
    one_line_error(run_cli("inputs", "dataset", "--config", config, "--inputs", tmp_path / "i"), config,
                   "larger than 1048576 bytes")


# ---- bad values in what summarize, history, baseline and check read (issue 54) --------------------------------------

def refused(capsys, *args, names=()):
    """`remax-bench ARGS` in this process: exit 2 with one line naming each of `names`, no traceback."""
    from harness.cli import main

    capsys.readouterr()
    code = main([str(a) for a in args])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, (code, err[-3000:])
    lines = [line for line in err.splitlines() if line.startswith("remax-bench ")]
    assert len(lines) == 1 and all(str(n) in lines[0] for n in names), err
    return lines[0]


def metrics_with(path, **columns):
    """The run's metrics file written again by the harness with some columns replaced."""
    import pandas as pd

    from harness.results.metrics import to_frame, write_metrics

    write_metrics(to_frame(pd.read_parquet(path).assign(**columns).to_dict("records"), "test"), path)


def test_summarize_refuses_an_infinite_figure_naming_the_run_and_the_column(tmp_path, capsys):
    import pandas as pd

    results = make_results(tmp_path / "results", seeds=(1, 2))
    good, bad = (results / "metrics" / "reference" / f"seed{s}.parquet" for s in (1, 2))
    metrics_with(bad, time_step_cpu_s=0.0)  # a CPU timer that read 0: wall over CPU time divides by it
    args = ["summarize", "--config", results / "config.json", "--metrics", good, bad, "--out", tmp_path / "s.csv"]
    refused(capsys, *args, names=(bad, "run reference-cpu-s2", "cpu_contention is inf"))
    assert not (tmp_path / "s.csv").exists()
    from harness.cli import main

    assert main([str(a) for a in [*args, "--partial"]]) == 0  # left out and named, as an unreadable run is
    assert f"summarize: left out: {bad}: run reference-cpu-s2: cpu_contention is inf" in capsys.readouterr().err
    assert list(pd.read_csv(tmp_path / "s.csv")["run_id"]) == ["reference-cpu-s1"]


def test_summarize_refuses_a_step_time_of_0_without_a_warning_first(tmp_path, capsys):
    """A step time of 0 in metrics another tool wrote: numpy's divide-by-zero RuntimeWarning printed a line before
    the refusal (an error here, so the test sees it). It is refused as it is read, naming the step and the column
    (the per-step schema's one rule, which ingest applies too)."""
    import warnings

    import pandas as pd

    results = make_results(tmp_path / "results", seeds=(1,))
    bad = results / "metrics" / "reference" / "seed1.parquet"
    pd.read_parquet(bad).assign(time_step_s=0.0, time_machine_busy_s=1.0, time_step_cpu_s=0.5).to_parquet(bad)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        refused(capsys, "summarize", "--config", results / "config.json", "--metrics", bad, "--out",
                tmp_path / "s.csv", names=(bad, "step 1: time_step_s is 0.0, not a positive number"))


def test_summarize_leaves_mfu_empty_naming_a_manifest_or_policy_config_of_the_wrong_shape(tmp_path, capsys):
    """A manifest's hardware a string (AttributeError) or gpus a number (TypeError), a policy config 20,000 deep
    (RecursionError) or naming its width in words: exit 3. As for an unreadable policy or manifest, the run's MFU
    stays empty and its peak_source says which file holds what (test_efficiency), the summary stands."""
    import pandas as pd

    from harness.cli import main

    results = make_results(tmp_path / "results", seeds=(1,))
    run, policy = results / "runs" / "reference" / "seed1", tmp_path / "policy"
    policy.mkdir()
    shape = {"hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 32,
             "vocab_size": 100}
    manifest = json.loads((run / "manifest.json").read_text())
    manifest.pop("peak_flops", None)
    for hardware, conf, said in (("gpu", shape, f"{run / 'manifest.json'}: hardware.gpus should be a list"),
                                 ({"gpus": 5}, shape, f"{run / 'manifest.json'}: hardware.gpus should be a list"),
                                 ({"gpus": ["NVIDIA A100-SXM4-80GB"]}, DEEP, "nested too deep to read"),
                                 ({"gpus": ["NVIDIA A100-SXM4-80GB"]}, {**shape, "hidden_size": "x"},
                                  "hidden_size should be a whole number above 0, not 'x'")):
        (run / "manifest.json").write_text(json.dumps({**manifest, "hardware": hardware}))
        (policy / "config.json").write_text(conf if isinstance(conf, str) else json.dumps(conf))
        capsys.readouterr()
        code = main([str(a) for a in ("summarize", "--config", results / "config.json", "--metrics",
                                      results / "metrics" / "reference" / "seed1.parquet", "--runs", run,
                                      "--policy", policy, "--out", tmp_path / "s.csv")])
        err = capsys.readouterr().err
        assert code == 0 and "Traceback" not in err, (code, err[-3000:])
        source = pd.read_csv(tmp_path / "s.csv")["peak_source"].iloc[0]
        assert said in source and (hardware == "gpu" or isinstance(hardware["gpus"], int)
                                   or f"no MFU: {policy / 'config.json'}: cannot read the model's shape" in source)


def test_summarize_refuses_two_eval_records_of_one_run_naming_both(tmp_path, capsys):
    results = make_results(tmp_path / "results", seeds=(1,))
    runs = [tmp_path / "run", tmp_path / "copy-of-run"]
    for run in runs:
        run.mkdir()
        (run / "eval.json").write_text(json.dumps({"run_id": "reference-cpu-s1", "before": {"greedy_accuracy": 0.1},
                                                   "after": {"greedy_accuracy": 0.5}}))
    refused(capsys, "summarize", "--config", results / "config.json", "--metrics",
            results / "metrics" / "reference" / "seed1.parquet", "--runs", *runs, "--out", tmp_path / "s.csv",
            names=(runs[0] / "eval.json", runs[1] / "eval.json", "two eval records of run reference-cpu-s1"))
    (runs[1] / "eval.json").write_text(json.dumps({"run_id": "reference-cpu-s1", "before": {"greedy_accuracy": "high"},
                                                   "after": {"greedy_accuracy": 0.5}}))
    refused(capsys, "summarize", "--config", results / "config.json", "--metrics",
            results / "metrics" / "reference" / "seed1.parquet", "--runs", runs[1], "--out", tmp_path / "s.csv",
            names=(runs[1] / "eval.json", "before.greedy_accuracy"))
    assert not (tmp_path / "s.csv").exists()


def test_a_metrics_file_without_steps_or_with_steps_that_are_not_integers_is_exit_2_naming_it(tmp_path, capsys):
    import pandas as pd

    from harness.results.metrics import write_metrics

    results = make_results(tmp_path / "results", seeds=(1, 2))
    bad = results / "metrics" / "reference" / "seed2.parquet"
    write_metrics(pd.read_parquet(bad).iloc[:0], bad)
    summarize = ["summarize", "--config", results / "config.json", "--metrics", bad, "--out", tmp_path / "s.csv"]
    refused(capsys, *summarize, names=(bad, "no steps"))
    refused(capsys, "history", "append", "--results", results, names=(bad, "no steps"))
    for step in ([1.5] * 20, ["1"] * 20):  # written by another tool than ingest
        pd.read_parquet(bad.parent / "seed1.parquet").assign(step=step).to_parquet(bad)
        refused(capsys, *summarize, names=(bad, "column step"))
        refused(capsys, "history", "append", "--results", results, names=(bad, "column step"))
    assert not (results / HISTORY).exists() and not (tmp_path / "s.csv").exists()


@pytest.fixture(scope="module")
def checked_world(tmp_path_factory):
    """Three nights in the history, a baseline of them, and a fourth night's outputs in the results directory:
    everything `check`, `baseline update` and `history append` read."""
    from harness.io import write_json
    from harness.regression.baseline import BASELINE_ROLE, build_baseline

    root = tmp_path_factory.mktemp("checked")
    nights(root / "results", 3)
    write_json(root / "cpu.json", build_baseline(root / "results" / HISTORY, profile="cpu", last=3), role=BASELINE_ROLE)
    make_results(root / "results", created="2026-01-04T00:00:00+00:00")
    return root


@pytest.fixture
def world(checked_world, tmp_path):
    import shutil

    shutil.copytree(checked_world, tmp_path / "world")
    return tmp_path / "world"


def readers(world):
    """The readers' commands on `world`, by what they read."""
    results = world / "results"
    return {"baseline update": ["baseline", "update", "--results", results, "--out", world / "new.json", "--last", 3],
            "check": ["check", "--baseline", world / "cpu.json", "--results", results],
            "history append": ["history", "append", "--results", results]}


def edit_row(path, line, edit):
    lines = path.read_text().splitlines(keepends=True)
    row = json.loads(lines[line - 1])
    edit(row)
    lines[line - 1] = json.dumps(row) + "\n"
    path.write_text("".join(lines))


def edit_json(path, edit):
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


def test_the_readers_of_an_undamaged_world_succeed(world, capsys):
    from harness.cli import main

    for name, args in readers(world).items():
        assert main([str(a) for a in args]) == 0, (name, capsys.readouterr().err)


def test_a_step_or_count_that_is_not_a_whole_number_in_64_bits_is_exit_2_naming_where(world, capsys):
    import pandas as pd

    run = readers(world)
    history = sorted((world / "results" / HISTORY).glob("*.jsonl"))[1]
    saved = history.read_bytes()
    for value, command in (("4", "baseline update"), (1.5, "check"), (2**70, "baseline update")):
        edit_row(history, 2, lambda row, value=value: row["curve"]["step"].__setitem__(3, value))
        refused(capsys, *run[command], names=(f"{history}:2", "curve.step[3]"))
        history.write_bytes(saved)
    summary = world / "results" / "summary.csv"
    good = pd.read_csv(summary)
    for column, value in (("seed", "1.5"), ("steps", "1e30"), ("seed", "one")):
        good.astype(object).assign(**{column: [value, *good[column].iloc[1:]]}).to_csv(summary, index=False)
        refused(capsys, *run["history append"], names=(f"{summary}:2", column))
    assert not (world / "new.json").exists()


def test_bytes_that_are_not_utf8_are_exit_2_naming_the_file_and_line(world, capsys):
    run = readers(world)
    results = world / "results"
    history = sorted((results / HISTORY).glob("*.jsonl"))[1]
    lines = history.read_bytes().splitlines(keepends=True)
    history.write_bytes(b"".join([lines[0], lines[1].replace(b'"cpu"', b'"cpu\xff"', 1), lines[2]]))
    for command in ("baseline update", "check"):
        refused(capsys, *run[command], names=(f"{history}:2", "not UTF-8"))
    summary = results / "summary.csv"
    saved = summary.read_bytes()
    summary.write_bytes(saved.replace(b"reference-cpu-s3", b"reference-cpu-s3\xff", 1))
    refused(capsys, *run["history append"], names=(f"{summary}:4", "not UTF-8"))
    summary.write_bytes(saved)
    manifest = results / "runs" / "reference" / "seed1" / "manifest.json"
    manifest.write_bytes(manifest.read_bytes().replace(b'"cpu"', b'"\xffcpu"', 1))
    refused(capsys, *run["history append"], names=(manifest, "utf-8"))
    baseline = world / "cpu.json"
    baseline.write_bytes(baseline.read_bytes().replace(b'"cpu"', b'"\xffcpu"', 1))
    refused(capsys, *run["check"], names=(baseline, "utf-8"))


DEEP = "[" * 20_000 + "]" * 20_000  # past the stack of Python's JSON parser


def test_json_nested_20000_deep_is_exit_2_naming_the_file(world, capsys):
    run = readers(world)
    results = world / "results"
    history = sorted((results / HISTORY).glob("*.jsonl"))[1]
    lines = history.read_text().splitlines(keepends=True)
    history.write_text(lines[0] + lines[1].replace('"schema": 1', f'"schema": 1, "x": {DEEP}', 1) + lines[2])
    refused(capsys, *run["baseline update"], names=(f"{history}:2",))
    baseline = world / "cpu.json"
    baseline.write_text(baseline.read_text().replace('"schema": 1', f'"schema": 1, "x": {DEEP}', 1))
    refused(capsys, *run["check"], names=(baseline,))
    manifest = results / "runs" / "reference" / "seed1" / "manifest.json"
    manifest.write_text(manifest.read_text().replace('"seed": 1', f'"seed": 1, "x": {DEEP}', 1))
    refused(capsys, *run["history append"], names=(manifest,))


def test_nan_infinity_and_numbers_past_a_float_are_exit_2_naming_the_file(world, capsys):
    run = readers(world)
    results = world / "results"
    history = sorted((results / HISTORY).glob("*.jsonl"))[1]
    saved = history.read_text()
    history.write_text(saved.replace('"reward_gain": ', '"reward_gain": 1e400, "x": ', 1))
    refused(capsys, *run["baseline update"], names=(f"{history}:1",))
    history.write_text(saved)
    baseline = world / "cpu.json"
    baseline.write_text(baseline.read_text().replace('"reward_target": ', '"reward_target": -1e400, "x": ', 1))
    refused(capsys, *run["check"], names=(baseline,))
    summary = results / "summary.csv"
    saved = summary.read_text()
    text = saved.splitlines(keepends=True)
    header = text[0].rstrip("\n").split(",")
    cells = text[2].rstrip("\n").split(",")
    cells[header.index("throughput_tok_s")] = "-Infinity"
    summary.write_text(text[0] + text[1] + ",".join(cells) + "\n" + "".join(text[3:]))
    refused(capsys, *run["history append"], names=(f"{summary}:3", "throughput_tok_s is -inf"))
    summary.write_text(saved)
    manifest = results / "runs" / "reference" / "seed1" / "manifest.json"
    manifest.write_text(manifest.read_text().replace('"seed": 1', '"seed": NaN', 1))
    refused(capsys, *run["history append"], names=(manifest, "NaN"))


def test_fields_of_the_wrong_type_are_exit_2_naming_the_file_and_the_field(world, capsys):
    run = readers(world)
    results = world / "results"
    manifest = results / "runs" / "reference" / "seed2" / "manifest.json"
    saved = manifest.read_text()
    for field, value in (("hardware", "8x A100"), ("created", 20260104), ("inputs", ["dataset"]),
                         ("config", "cpu.yaml")):
        edit_json(manifest, lambda m, field=field, value=value: m.update({field: value}))
        refused(capsys, *run["history append"], names=(manifest, field))
        manifest.write_text(saved)
    history = sorted((results / HISTORY).glob("*.jsonl"))[1]
    saved = history.read_text()
    for edit, field in ((lambda r: r["provenance"].update(config=[]), "provenance.config"),
                        (lambda r: r["metrics"].update(reward_first10=None), "metrics.reward_first10"),
                        (lambda r: r["curve"].update(reward=["high"]), "curve.reward[0]"),
                        (lambda r: r.update(seed=True), "seed")):
        edit_row(history, 3, edit)
        refused(capsys, *run["baseline update"], names=(f"{history}:3", field))
        history.write_text(saved)
    baseline = world / "cpu.json"
    saved = baseline.read_text()
    for edit, field in ((lambda b: b["frameworks"]["reference"].update(provenance="cpu"), "provenance"),
                        (lambda b: b["frameworks"]["reference"].pop("provenance"), "provenance"),
                        (lambda b: b["frameworks"]["reference"]["runs"][0].update(pipeline_time=5), "pipeline_time"),
                        (lambda b: b.update(frameworks=[]), "frameworks")):
        edit_json(baseline, edit)
        refused(capsys, *run["check"], names=(baseline, field))
        baseline.write_text(saved)
    config = results / "config.json"
    config.write_text("{not json")
    refused(capsys, *run["baseline update"], names=(config,))
    config.write_text(json.dumps({"profile": ["cpu"]}))
    refused(capsys, *run["baseline update"], names=(config, "profile"))
    assert not (world / "new.json").exists()


# ---- what the CLI and a checkpoint's config.json give, refused naming it before any work (issue 54, round 2) --------

def test_ab_refuses_an_override_nested_deep_huge_or_not_finite_before_any_work(tmp_path, capsys):
    """--b-set 20,000 deep was a RecursionError, a 5,000-digit integer a ValueError, exit 3; NaN in --a-set was
    refused only after arm A's freeze-config had run."""
    config = REPO / "workflows" / "config" / "micro.yaml"
    for flag, text, said in (("--b-set", DEEP, "nested too deep"),
                             ("--a-set", '{"remax": {"steps": ' + "9" * 5000 + "}}", "4300 digits"),
                             ("--a-set", '{"remax": {"lr": NaN}}', "NaN is not a number")):
        refused(capsys, "ab", "--a", "HEAD", "--b", "HEAD", "--config", config, flag, text, "--out", tmp_path / "ab",
                names=(f"{flag}: not valid JSON", said))
    assert not (tmp_path / "ab").exists()


def test_a_seed_past_2_32_or_a_time_past_7_days_is_refused_by_the_cli(tiny, tmp_path):
    """A seed numpy cannot take was a ValueError in seed_everything (exit 3); --timeout-min 1e308 never timed out."""
    run = ["run", "reference", "--config", tiny["config"], "--out", tmp_path / "run", "--inputs", tiny["inputs"]]
    ab = ["ab", "--a", "HEAD", "--b", "HEAD", "--config", tiny["config"], "--out", tmp_path / "ab"]
    for args, said in (([*run, "--seed", 2**32], "argument --seed: at most 4294967295, not 4294967296"),
                       ([*ab, "--seeds", f"1,{2**63 - 1}"], "argument --seeds: seeds: comma-separated integers"),
                       (["launch", tiny["run"], "--config", tiny["config"], "--out", tmp_path / "run",
                         "--timeout-min", "1e308"], "argument --timeout-min: at most 10080 minutes (7 days)"),
                       ([*ab, "--max-minutes", "20000"], "argument --max-minutes: at most 10080 minutes")):
        one_line_error(run_cli(*args), said)
    assert not (tmp_path / "run").exists() and not (tmp_path / "ab").exists()


@pytest.fixture(scope="module")
def gpu_checkpoint(tmp_path_factory):
    """The a100x8 profile's inputs, its policy a linked checkpoint directory (config.json only: nothing here loads
    the model), for the preflight and the plans to read."""
    import yaml
    from conftest import a100x8_offline

    from harness.config import load_config
    from harness.inputs import build_dataset, build_policy, build_reward

    root = tmp_path_factory.mktemp("gpu-checkpoint")
    (root / "ckpt").mkdir()
    (root / "ckpt" / "config.json").write_text("{}")
    raw = a100x8_offline(0, 20)
    raw["policy"]["path"] = str(root / "ckpt")
    raw["task"]["n_train"] = raw["remax"]["steps"] * raw["remax"]["train_batch_size"] + 40
    (root / "config.yaml").write_text(yaml.safe_dump(raw))
    config = load_config(root / "config.yaml")
    for build in (build_dataset, build_policy, build_reward):
        build(config, root / "inputs")
    return root


@pytest.mark.parametrize("text, said", [(DEEP, "nested too deep to read"), ("[1]", "a JSON object, not list"),
                                        ('{"hidden_size": "x", "num_attention_heads": 2}', "hidden_size"),
                                        ('{"max_position_embeddings": "big"}', "max_position_embeddings")],
                         ids=["deep", "a list", "hidden_size text", "max_position_embeddings text"])
def test_a_checkpoint_config_of_the_wrong_shape_is_exit_2_naming_it_in_the_preflight_and_the_plans(
        gpu_checkpoint, tmp_path, capsys, text, said):
    """A RecursionError, AttributeError or TypeError (exit 3) in preflight's checkpoint row, dschat's copy of the
    config and OpenRLHF's max_len; each reads it through harness.checkpoint now."""
    from harness.cli import main
    from harness.io import record_hash

    root = gpu_checkpoint
    conf = root / "ckpt" / "config.json"
    conf.write_text(text)
    record_hash(root / "inputs" / "policy")  # the input as built from this checkpoint
    capsys.readouterr()
    assert main(["preflight", "--config", str(root / "config.yaml"), "--results", str(tmp_path / "results")]) == 2
    out, err = capsys.readouterr()
    row = next(line for line in out.splitlines() if line.startswith("| policy checkpoint |"))
    assert "Traceback" not in err and (("| fail |" in row and str(conf) in row and said in row)
                                       or said == "max_position_embeddings"), (row, err[-2000:])
    plans = {"dschat": said not in ("hidden_size", "max_position_embeddings"),  # dschat copies the config whole
             "openrlhf": said != "hidden_size"}
    for framework, reads_it in plans.items():
        if reads_it:
            line = refused(capsys, "plan", framework, "--config", root / "config.yaml", "--seed", 1, "--inputs",
                           root / "inputs", "--out", tmp_path / framework, names=(said,))
            # the checkpoint's file, or the input's link to it
            assert f"{conf}: " in line or f"{root / 'inputs' / 'policy' / 'config.json'}: " in line, line
            assert not (tmp_path / framework).exists()
