"""Whether a run reproduces (docs/reproducibility.md): `remax-bench reproduce`, the comparison it makes, repeats in the
report, and the reference backend under `reproducibility.determinism: strict`."""

from __future__ import annotations

import importlib.metadata
import json
import math
import os

import pandas as pd
import pytest
import torch
import yaml
from conftest import REPO, run_cli, snakemake
from test_injection import setting  # noqa: F401 (a fixture: small inputs every planned framework accepts)

from harness import HarnessError, cli, remax
from harness.config import validate_config
from harness.frameworks import get_adapter
from harness.frameworks.reference.backend import evaluate
from harness.frameworks.reference.model import Decoder
from harness.inputs import resolve_inputs, task
from harness.inputs.policy import load_policy
from harness.io import sha256_tree
from harness.report import render
from harness.results import layout
from harness.results.metrics import read_metrics
from harness.results.reproducibility import BEHAVIOUR, first_divergence, greedy_responses, step0_agreement, verdict_text
from harness.reward.shared import load_shared_reward
from harness.runs.reproduce import RECORD
from harness.runtime import envs

TINY = {"profile": "tiny", "seeds": [1, 2], "task": {"n_train": 64, "n_eval": 8},
        "policy": {"hidden_size": 16, "intermediate_size": 32, "num_layers": 1, "num_heads": 2,
                   "sft": {"steps": 1, "batch_size": 8}},
        "remax": {"steps": 6, "warmup_steps": 1, "train_batch_size": 4, "rollout_n": 2},
        "reference": {"eval_batch_size": 8},
        "reproducibility": {"determinism": "strict", "repeat_seeds": [1]}}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """A results directory as the pipeline leaves it for TINY, by the CLI: config, inputs, both seeds' runs and
    metrics and summary (no repeat yet)."""
    root = tmp_path_factory.mktemp("repro")
    res = root / "results"
    proc = run_cli("freeze-config", "--json", json.dumps(TINY), "--out", res / "config.json")
    assert proc.returncode == 0, proc.stderr
    for what in ("dataset", "policy", "reward"):
        assert run_cli("inputs", what, "--config", res / "config.json", "--inputs", res / "inputs").returncode == 0
    for seed in TINY["seeds"]:
        run = layout.path(res, layout.RUN, framework="reference", seed=seed)
        proc = run_cli("run", "reference", "--config", res / "config.json", "--seed", seed, "--out", run,
                       "--inputs", res / "inputs")
        assert proc.returncode == 0, proc.stderr
        assert run_cli("ingest", "reference", run, "--out",
                       layout.path(res, layout.METRICS, framework="reference", seed=seed)).returncode == 0
    metrics = [layout.path(res, layout.METRICS, framework="reference", seed=seed) for seed in TINY["seeds"]]
    runs = [layout.path(res, layout.RUN, framework="reference", seed=seed) for seed in TINY["seeds"]]
    proc = run_cli("summarize", "--config", res / "config.json", "--metrics", *metrics, "--runs", *runs,
                   "--out", layout.path(res, layout.SUMMARY))
    assert proc.returncode == 0, proc.stderr
    return res


def steps(**columns):
    base = {"step": [1, 2, 3], **{m: [0.5, 0.5, 0.5] for m in BEHAVIOUR}}
    return pd.DataFrame({**base, **columns})


def test_first_divergence_names_the_step_the_metric_and_both_values():
    assert first_divergence(steps(), steps()) is None
    assert first_divergence(steps(task_accuracy_mean=[math.nan] * 3), steps(task_accuracy_mean=[math.nan] * 3)) is None
    found = first_divergence(steps(), steps(kl_mean=[0.5, 0.5, 0.5000001], reward_mean=[0.5, 0.5, 0.6]))
    assert found == {"step": 3, "metric": "reward_mean", "original": 0.5, "repeat": 0.6}  # BEHAVIOUR's order
    assert verdict_text(found) == "diverged at step 3 on reward_mean (0.5 against 0.6)"
    short = first_divergence(steps(), steps().iloc[:2])
    assert short == {"step": 3, "metric": "step", "original": True, "repeat": False}


def test_a_strict_repeat_of_the_reference_is_identical_and_lands_in_the_report(results):
    original = layout.path(results, layout.RUN, framework="reference", seed=1)
    repeat = layout.path(results, layout.REPEAT, framework="reference", seed=1, repeat=2)
    proc = run_cli("reproduce", original, "--out", repeat)
    assert proc.returncode == 0, proc.stderr
    assert "reference-tiny-s1: identical" in proc.stdout
    record = json.loads((repeat / RECORD).read_text())
    assert record["verdict"] == "identical" and record["determinism"] == "strict"
    a, b = read_metrics(original / "metrics.parquet"), read_metrics(repeat / "metrics.parquet")
    pd.testing.assert_frame_equal(a[["step", *BEHAVIOUR]], b[["step", *BEHAVIOUR]])  # bitwise, not approximately
    manifest = json.loads((repeat / "manifest.json").read_text())
    assert manifest["determinism"]["mode"] == "strict"
    assert any("use_deterministic_algorithms" in k["knob"] for k in manifest["determinism"]["knobs"])
    render(results, results / "report")
    page = (results / "report" / "index.html").read_text()
    section = page[page.index("7. Reproducibility"):]
    assert "determinism <b>strict</b>" in section and "<b>identical</b>" in section
    assert "between seeds" in section


def test_an_injected_nondeterministic_update_is_named_at_the_first_step_it_shows(results, tmp_path, monkeypatch):
    """The update of step 3 gets noise from an unseeded generator, in this test only; step 3's own figures were
    computed before it, so the first step that can differ is step 4 (its samples and log-probs use the new
    weights)."""
    calls = {"n": 0}
    exact = remax.remax_advantages

    def noisy(*args, **kwargs):
        calls["n"] += 1
        out = exact(*args, **kwargs)
        if calls["n"] == 3:
            g = torch.Generator().manual_seed(int.from_bytes(os.urandom(8), "little"))
            out = out + 1e-3 * torch.rand(out.shape, generator=g)
        return out

    monkeypatch.setattr(remax, "remax_advantages", noisy)
    original = layout.path(results, layout.RUN, framework="reference", seed=1)
    out = tmp_path / "seed1-noisy"
    assert cli.main(["reproduce", str(original), "--out", str(out)]) == 0
    record = json.loads((out / RECORD).read_text())
    assert record["verdict"] == "diverged" and record["divergence"]["step"] == 4, record
    assert record["divergence"]["metric"] in BEHAVIOUR
    assert record["text"].startswith("diverged at step 4 on ")


def test_reproduce_refuses_a_changed_input_or_package_naming_it_and_touches_nothing(results, tmp_path):
    original = layout.path(results, layout.RUN, framework="reference", seed=2)
    before = {p: sha256_tree(p) for p in original.rglob("*") if p.is_file()}

    manifest_path = original / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    other_run = tmp_path / "other-run"  # the run as a machine with another torch recorded it
    other_run.mkdir()
    for p in original.iterdir():
        (other_run / p.name).write_bytes(p.read_bytes())
    manifest["versions"]["torch"] = "2.12.0"
    (other_run / "manifest.json").write_text(json.dumps(manifest))
    proc = run_cli("reproduce", other_run, "--out", tmp_path / "r1")
    assert proc.returncode == 2 and "could not reproduce" in proc.stderr
    assert f"package torch: recorded '2.12.0', now '{importlib.metadata.version('torch')}'" in proc.stderr
    assert not (tmp_path / "r1").exists()

    dataset = results / "inputs" / "dataset.jsonl"
    saved = dataset.read_bytes()
    try:
        dataset.write_bytes(saved.replace(b"+", b"-", 1))  # one prompt edited after the run
        proc = run_cli("reproduce", original, "--out", tmp_path / "r2")
    finally:
        dataset.write_bytes(saved)
    assert proc.returncode == 2 and "could not reproduce" in proc.stderr
    assert "dataset.jsonl: sha256 mismatch" in proc.stderr
    assert not (tmp_path / "r2").exists()

    proc = run_cli("reproduce", original, "--out", original)
    assert proc.returncode == 2 and "would overwrite the original run" in proc.stderr
    assert {p: sha256_tree(p) for p in original.rglob("*") if p.is_file()} == before


def test_repeats_are_pipeline_runs_of_their_own(tmp_path):
    """`snakemake -n` lists one repeat job per framework and repeated seed beyond the original."""
    extra = tmp_path / "repeat.yaml"
    extra.write_text(yaml.safe_dump({"reproducibility": {"repeat_seeds": [1, 2], "repeats": 3}}))
    proc = snakemake(tmp_path, "-n", "--configfile", REPO / "workflows" / "config" / "micro.yaml", extra)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.count("rule repeat:") == 4, proc.stdout[-3000:]  # 2 seeds x 2 repeats of the reference
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"reproducibility": {"repeat_seeds": [7]}}))
    proc = snakemake(tmp_path, "-n", "--configfile", REPO / "workflows" / "config" / "micro.yaml", bad)
    assert proc.returncode != 0
    assert "at reproducibility.repeat_seeds: seed(s) [7] are not in seeds" in proc.stdout + proc.stderr


@pytest.mark.parametrize("device", ["gpu", "cpu"])
def test_strict_maps_to_each_frameworks_own_knobs_with_their_sources(setting, tmp_path, monkeypatch, device):  # noqa: F811
    """Each plan under strict carries its framework's knobs in its command or environment, records them with the
    source line that reads them, and states what stays nondeterministic as a deviation; under off it adds none."""
    monkeypatch.setattr(envs, "ENV_ROOT", setting["venvs"])
    raw = {**setting["raw"], "launch": {"device": device, "gpus_per_node": 0 if device == "cpu" else 1}}
    frameworks = ["verl", "dschat"] + (["openrlhf"] if device == "gpu" else [])
    for mode in ("off", "strict"):
        config = validate_config({**raw, "reproducibility": {"determinism": mode}})
        for fw in frameworks:
            out = tmp_path / device / mode / fw
            get_adapter(fw).plan(config, 1, out, setting["inputs"])
            plan = json.loads((out / "plan.json").read_text())
            record = plan["determinism"]
            assert record["mode"] == mode
            if mode == "off":
                assert record["knobs"] == [] and record["not_strict"] is None
                if fw == "openrlhf":
                    assert json.loads((out / "remax_agent.json").read_text())["sampling_seed"] is None
                continue
            assert record["knobs"] and all(k["source"] and k["does"] for k in record["knobs"])
            words = " ".join(plan["argv"]) + " " + " ".join(f"{k}={v}" for k, v in plan["env_vars"].items())
            if fw == "openrlhf":  # the harness's ReMax agent seeds each sampled request from its planned config
                agent = json.loads((out / "remax_agent.json").read_text())
                assert agent["sampling_seed"] == 1
                words += " remax_agent.json sampling_seed"
            for knob in record["knobs"]:
                assert any(part in words for part in knob["knob"].replace("{actor,ref}", "actor").split(", ")), \
                    (fw, knob["knob"])
            stated = [d for d in plan["deviations"] if d["key"] == "reproducibility.determinism"]
            assert bool(stated) == bool(record["not_strict"]) and all(d["cause"] for d in stated)
            if fw == "dschat" or device == "cpu":  # verl and OpenRLHF on a GPU have a knob for every part
                assert record["not_strict"], fw
    gpu_verl = json.loads((tmp_path / "gpu" / "strict" / "verl" / "plan.json").read_text()) if device == "gpu" else None
    if gpu_verl:
        assert "actor_rollout_ref.rollout.full_determinism=True" in gpu_verl["argv"]


def test_step0_agreement_is_exact_between_reference_seeds_and_catches_a_policy_padded_on_the_right(results):
    """Greedy decoding of one policy on one set of prompts is a function of the weights, whatever the seed, so two
    reference runs agree on every prompt before training. Padding on the right, the fault of a framework that
    batches a decoder-only model the wrong way, shifts the shorter prompts' positions: step-0 agreement names one."""
    stored = {seed: json.loads((layout.path(results, layout.RUN, framework="reference", seed=seed)
                                / "eval.json").read_text()) for seed in TINY["seeds"]}
    first, second = (greedy_responses(stored[s], f"seed {s}") for s in TINY["seeds"])
    assert first is not None and second is not None and len(first) == TINY["task"]["n_eval"]
    assert step0_agreement(first, second) == {"n": len(first), "agree": len(first), "missing": 0, "first": None}

    config = json.loads((results / "config.json").read_text())
    inputs = resolve_inputs(results / "inputs")
    rows = task.read_dataset(inputs["dataset"]["path"])["eval"]
    shared = load_shared_reward(inputs["reward"])
    policy, tokenizer = load_policy(inputs["policy"]["path"], torch.device("cpu"))
    model = Decoder(policy).eval()

    def responses() -> dict[str, str]:
        record = evaluate(model, tokenizer, rows, config["remax"], len(rows), torch.device("cpu"), shared)
        return greedy_responses({"before": record}, "this test") or {}

    assert step0_agreement(first, responses())["agree"] == len(first)
    tokenizer.padding_side = "right"
    padded_right = step0_agreement(first, responses())
    assert padded_right["missing"] == 0 and padded_right["agree"] < len(first), padded_right
    assert padded_right["first"]["reference"] != padded_right["first"]["framework"]
    longest = max(len(tokenizer(p)["input_ids"]) for p in first)
    assert len(tokenizer(padded_right["first"]["prompt"])["input_ids"]) < longest  # only a padded prompt moves


def test_responses_that_are_not_prompt_response_strings_are_refused_naming_the_file():
    with pytest.raises(HarnessError, match=r"eval\.json: before\.responses is not a list"):
        greedy_responses({"before": {"responses": [{"prompt": "1+1=", "response": 2}]}}, "eval.json")
    assert greedy_responses({"before": {"greedy_accuracy": 0.5}}, "eval.json") is None  # kept no responses


def _manifest(run_dir, **fields):
    """A run directory holding only a manifest: what `reproduce` reads first."""
    run_dir.mkdir(exist_ok=True)
    manifest = {"framework": "reference", "framework_version": "0.1.0", "run_id": "reference-tiny-s1", "seed": 1,
                "profile": "tiny", "config": TINY, "config_hash": "0" * 16,
                "inputs": {"dataset": {"path": str(run_dir / "inputs" / "dataset.jsonl"), "sha256": "0" * 64}},
                **fields}
    (run_dir / "manifest.json").write_text(json.dumps(manifest))
    return run_dir / "manifest.json"


def _refused(capsys, *args, names=()):
    capsys.readouterr()
    code = cli.main([str(a) for a in args])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, (code, err[-3000:])
    lines = [line for line in err.splitlines() if line.startswith("remax-bench ")]
    assert len(lines) == 1 and all(str(n) in lines[0] for n in names), err


def test_reproduce_refuses_a_foreign_out_before_any_work(tmp_path, monkeypatch, capsys):
    """It checked the inputs, packages and machine (seconds) and only then found it could not write its --out."""
    run = tmp_path / "run"
    _manifest(run)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("my notes")

    def work(*args, **kwargs):
        raise AssertionError("reproduce worked before checking its --out")

    for step in ("validate_config", "differences", "run_steps"):
        monkeypatch.setattr(f"harness.runs.reproduce.{step}", work)
    _refused(capsys, "reproduce", run, "--out", mine, names=(mine, "not the kind run framework reference seed 1"))
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]


def test_reproduce_refuses_a_manifest_field_of_the_wrong_type_naming_it(tmp_path, capsys):
    run = tmp_path / "run"
    for fields, named in (({"seed": "one"}, "seed"), ({"config": ["tiny"]}, "config"),
                          ({"inputs": {}}, "inputs.dataset"),
                          ({"inputs": {"dataset": {"path": 5}}}, "inputs.dataset.path"),
                          ({"hardware": "a laptop"}, "hardware"),
                          ({"environment": {"packages": "torch"}}, "environment.packages")):
        manifest = _manifest(run, **fields)
        _refused(capsys, "reproduce", run, "--out", tmp_path / "again", names=(manifest, named))
    manifest.write_text(manifest.read_text().replace('"seed": 1', '"seed": NaN'))
    _refused(capsys, "reproduce", run, "--out", tmp_path / "again", names=(manifest, "NaN"))
    manifest.write_text('{"seed": ' + "[" * 20_000 + "]" * 20_000 + "}")
    _refused(capsys, "reproduce", run, "--out", tmp_path / "again", names=(manifest,))
    assert not (tmp_path / "again").exists()
