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
import yaml
from conftest import run_cli, snakemake
from test_history import make_results
from test_regression import nights

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


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A finished reference run of 3 steps, with its inputs, metrics and summary, made by the CLI."""
    root = tmp_path_factory.mktemp("tiny")
    config = root / "config.yaml"
    config.write_text(yaml.safe_dump({
        "profile": "tiny", "seeds": [1], "task": {"n_train": 64, "n_eval": 8},
        "policy": {"hidden_size": 16, "intermediate_size": 32, "num_layers": 1, "num_heads": 2,
                   "sft": {"steps": 1, "batch_size": 8}},
        "remax": {"steps": 3, "warmup_steps": 1, "train_batch_size": 4, "rollout_n": 2},
        "reference": {"eval_batch_size": 8}}))
    proc = run_cli("freeze-config", "--json", json.dumps(yaml.safe_load(config.read_text())),
                   "--out", root / "results" / "config.json")
    assert proc.returncode == 0, proc.stderr
    inputs = root / "results" / "inputs"
    for what in ("dataset", "policy", "reward"):
        assert run_cli("inputs", what, "--config", config, "--inputs", inputs).returncode == 0
    run = root / "results" / "runs" / "reference" / "seed1"
    proc = run_cli("run", "reference", "--config", config, "--seed", 1, "--out", run, "--inputs", inputs)
    assert proc.returncode == 0, proc.stderr
    metrics = root / "results" / "metrics" / "reference" / "seed1.parquet"
    assert run_cli("ingest", "reference", run, "--out", metrics).returncode == 0
    proc = run_cli("summarize", "--config", config, "--metrics", metrics, "--runs", run,
                   "--out", root / "results" / "summary.csv")
    assert proc.returncode == 0, proc.stderr
    return {"root": root, "config": config, "inputs": inputs, "run": run, "metrics": metrics}


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
    assert json.loads((run / OWNER).read_text()) == {"kind": "run", "framework": "reference", "seed": 1}
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


def test_an_oversized_config_is_refused_before_it_is_parsed(tmp_path):
    config = tmp_path / "huge.yaml"
    config.write_text("profile: cpu\n" + "# padding\n" * 200_000)
    one_line_error(run_cli("inputs", "dataset", "--config", config, "--inputs", tmp_path / "i"), config,
                   "larger than 1048576 bytes")
