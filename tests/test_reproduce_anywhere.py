"""`remax-bench reproduce` of a whole comparison, from its bundle, on "another machine" (harness.runs.
reproduce_comparison): on one host, what rounds the way another CPU does is torch's kernel path
(ATEN_CPU_CAPABILITY=default: its scalar kernels instead of the AVX2/AVX-512 ones this CPU picks), and the rerun
must call every figure consistent; a planted real change (the reference backend's learning rate cut tenfold, a commit
in a clone) must be called not consistent, and so must the KL term's sign flipped, on a profile where the KL term
changes what is learnt. The original is the default profile's learning run of the reference backend (3 seeds x 400
steps): the figures are judged where there is learning to judge."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import yaml
from conftest import BIN, REPO, clone_with_commit, run_cli, snakemake

from harness.io import record_hash
from harness.runs.reproduce_comparison import RECORD

sys.path.insert(0, str(REPO / "scripts"))
sys.path.append(str(REPO / "benchmarks"))
import browser_check
import reproduce_power

LR_LINE = ('return torch.optim.AdamW(trainer.parameters(), lr=rc["lr"])',
           'return torch.optim.AdamW(trainer.parameters(), lr=rc["lr"] * 0.1)')


@pytest.fixture(scope="module")
def original(tmp_path_factory):
    root = tmp_path_factory.mktemp("anywhere")
    (root / "only-reference.yaml").write_text(yaml.safe_dump({"frameworks": ["reference"]}))
    proc = snakemake(root, "--cores", "2", "--configfile", REPO / "workflows" / "config" / "cpu.yaml",
                     root / "only-reference.yaml")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return root / "results"


def test_a_bundle_rerun_on_another_kernel_path_is_consistent_figure_by_figure(original, tmp_path):
    bundle = tmp_path / "comparison.tar.gz"
    proc = run_cli("bundle", original, "--out", bundle)
    assert proc.returncode == 0, proc.stderr
    out = tmp_path / "elsewhere"
    # two of the three seeds: the scalar kernels take twice as long, and the verdict needs two a side at least
    proc = subprocess.run([str(BIN / "remax-bench"), "reproduce", str(bundle), "--out", str(out), "--seeds", "1", "3"],
                          text=True, capture_output=True, env={**os.environ, "ATEN_CPU_CAPABILITY": "default"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    record = json.loads((out / RECORD).read_text())
    assert record["verdict"] == "consistent", record["figures"]
    assert record["divergences"], "the other kernel path computed the same bits: not another machine"
    judged = {f["figure"]: f for f in record["figures"]}
    assert {"reward_gain", "final_reward", "eval_accuracy", "time_to_reward_step"} <= set(judged)
    assert all(f["verdict"] == "consistent" and (f["n_original"], f["n_rerun"]) == (3, 2) for f in judged.values())
    assert judged["reward_gain"]["original"] > 0.3  # a learning run, so the figures judge learning
    page = (out / "index.html").read_text()
    assert "Reproduction: <span" in page and "reward gain" in page and "seed spreads" in page
    if browser_check.chromium_path() is not None:  # .ci/run installs it; test_report.py's browser tests say so
        sections = ["1. Verdict per figure", "2. What differs between the two worlds", "3. Throughput on each machine",
                    "4. Reward curves, original and rerun"]
        assert browser_check.check_page(out / "index.html", tmp_path / "shot.png", sections) == []


def test_a_planted_learning_rate_change_is_not_consistent_and_its_commit_is_named(original, tmp_path):
    clone = clone_with_commit(tmp_path / "repo", "harness/frameworks/reference/backend.py", LR_LINE,
                              "a tenth of the learning rate")
    out = tmp_path / "planted"
    proc = subprocess.run([sys.executable, "-m", "harness.cli", "reproduce", str(original), "--out", str(out),
                           "--seeds", "1", "2"], cwd=clone, text=True, capture_output=True,
                          env={**os.environ, "PYTHONPATH": str(clone)})
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"\n{original}: not consistent (" in proc.stdout  # after a progress line per run
    record = json.loads((out / RECORD).read_text())
    verdicts = {f["figure"]: f["verdict"] for f in record["figures"]}
    assert "not consistent" in (verdicts["reward_gain"], verdicts["final_reward"]), record["figures"]
    assert any("1 file changed" in w for w in record["world"]), record["world"]


def test_the_kl_terms_sign_flipped_is_not_consistent_where_the_kl_term_matters(tmp_path):
    """At the profiles' kl_coef of 0.001 the KL term does not change what is learnt, so neither can its sign
    (docs/reproducibility.md, "Measured"); benchmarks/reproduce_power.py's profile (cpu-short, 30 SFT steps, kl_coef
    0.05) is one where it does, and its 3 seeds, rerun by a clone with the sign flipped, must be not consistent."""
    (tmp_path / "profile.yaml").write_text(yaml.safe_dump(reproduce_power.profile()))
    proc = snakemake(tmp_path, "--cores", "2", "--configfile", tmp_path / "profile.yaml")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    clone = clone_with_commit(tmp_path / "repo", "harness/remax.py", reproduce_power.KL_LINE,
                              "the KL term's sign flipped")
    out = tmp_path / "flipped"
    proc = subprocess.run([sys.executable, "-m", "harness.cli", "reproduce", str(tmp_path / "results"), "--out",
                           str(out)], cwd=clone, text=True, capture_output=True,
                          env={**os.environ, "PYTHONPATH": str(clone)})
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    # the final reward is the figure the flip moves most: not consistent in 99.7% of the benchmark's 3-seed sets
    verdicts = {f["figure"]: f["verdict"] for f in json.loads((out / RECORD).read_text())["figures"]}
    assert verdicts["final_reward"] == "not consistent", verdicts


def test_another_input_is_the_one_refusal_and_nothing_is_written(tiny, tmp_path):
    results = tmp_path / "results"
    shutil.copytree(tiny["root"] / "results", results)
    dataset = results / "inputs" / "dataset.jsonl"
    dataset.write_text(dataset.read_text().replace("1", "2", 1))
    record_hash(dataset)  # a consistent input, just not the one the runs recorded
    out = tmp_path / "rerun"
    proc = run_cli("reproduce", results, "--out", out)
    assert proc.returncode == 2 and "input dataset has sha256" in proc.stderr and "not the same experiment" in \
        proc.stderr, proc.stderr
    assert not out.exists()


def test_a_framework_or_seed_the_comparison_lacks_is_refused_naming_it(tiny, tmp_path):
    proc = run_cli("reproduce", tiny["root"] / "results", "--out", tmp_path / "a", "--frameworks", "verl")
    assert proc.returncode == 2 and "has no run of framework verl (it has reference)" in proc.stderr, proc.stderr
    proc = run_cli("reproduce", tiny["root"] / "results", "--out", tmp_path / "b", "--seeds", "7")
    assert proc.returncode == 2 and "has no run of seed 7 (it has 1)" in proc.stderr, proc.stderr
    proc = run_cli("reproduce", tiny["run"], "--out", tmp_path / "c", "--seeds", "1")
    assert proc.returncode == 2 and "one run; --frameworks and --seeds choose among a comparison's" in proc.stderr
    assert not any((tmp_path / name).exists() for name in "abc")
