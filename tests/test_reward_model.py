"""A reward model as the shared reward: training the tiny one, checking checkpoints, the input's hashes, scoring."""

import json
import random
import shutil

import pytest
import torch
import yaml
from conftest import REPO, snakemake
from reward_inputs import save_reward_model

from harness import HarnessError
from harness.config import validate_config
from harness.inputs import build_dataset, build_policy, build_reward, resolve_inputs, task
from harness.inputs.reward_model import CORRUPTIONS, corrupt
from harness.reward.model import RewardModel, check_checkpoint
from harness.reward.shared import load_shared_reward


def small_config(**reward):
    raw = yaml.safe_load((REPO / "workflows" / "config" / "micro.yaml").read_text())
    raw.update(task={"kind": "reverse", "digits": 1, "n_train": 80, "n_eval": 20},
               policy={"hidden_size": 32, "intermediate_size": 64, "num_layers": 1, "num_heads": 2,
                       "sft": {"steps": 40, "batch_size": 32}},
               reward={"kind": "model", **reward})
    return validate_config(raw, source="test")


def trained_inputs(root, steps):
    config = small_config(train={"steps": steps, "batch_size": 32, "lr": 0.003})
    build_dataset(config, root)
    build_policy(config, root)
    build_reward(config, root)
    return config, json.loads((root / "reward" / "reward.json").read_text())


def test_trained_reward_model_ranks_held_out_pairs_and_training_is_what_does_it(tmp_path):
    _, trained = trained_inputs(tmp_path / "trained", steps=120)
    _, untrained = trained_inputs(tmp_path / "untrained", steps=1)
    # Held-out prompts (the eval split): made-up mistakes and the SFT policy's own wrong samples.
    assert trained["eval_pairs"] > 50 and "policy" in trained["pair_accuracy_eval_by_mistake"]
    assert trained["pair_accuracy_eval"] >= 0.8 > untrained["pair_accuracy_eval"] + 0.2
    assert trained["architecture"] == "LlamaForSequenceClassification" and len(trained["sha256"]) == 64


def test_the_shared_reward_prefers_the_right_answer_and_scores_in_batches(tmp_path):
    trained_inputs(tmp_path, steps=120)
    shared = load_shared_reward(resolve_inputs(tmp_path)["reward"], device="cpu", batch_size=4)
    assert shared.identity["kind"] == "model"
    rows = task.read_dataset(tmp_path / "dataset.jsonl")["eval"]
    right = shared.score([r["prompt"] for r in rows], [r["answer"] for r in rows], [""] * len(rows))
    rng = random.Random(0)
    wrong = shared.score([r["prompt"] for r in rows], [corrupt(r["answer"], "random", rng) for r in rows],
                         [""] * len(rows))
    assert sum(a > b for a, b in zip(right, wrong)) >= 0.8 * len(rows)
    # Batches of 4 and one batch of all: the same scores (left padding does not move the score's token).
    whole = RewardModel(tmp_path / "reward" / "model", device="cpu", batch_size=64).score(
        [r["prompt"] for r in rows], [r["answer"] for r in rows])
    assert whole == pytest.approx(right, abs=1e-5)


def test_corrupt_always_makes_a_wrong_answer():
    rng = random.Random(1)
    for answer in ("5", "55", "5555", "1234", "90"):
        for how in CORRUPTIONS:
            assert corrupt(answer, how, rng) != answer


def test_checkpoint_checks_name_the_path_and_the_fault(tmp_path):
    good = save_reward_model(tmp_path / "rm", ["12>21", "34>43"])
    assert check_checkpoint(good)["architecture"] == "LlamaForSequenceClassification"

    causal = tmp_path / "causal"
    shutil.copytree(good, causal)
    cfg = json.loads((causal / "config.json").read_text())
    (causal / "config.json").write_text(json.dumps({**cfg, "architectures": ["LlamaForCausalLM"]}))
    with pytest.raises(HarnessError, match=r"reward model .*causal: architectures \['LlamaForCausalLM'\]"):
        check_checkpoint(causal)

    two = tmp_path / "two"
    shutil.copytree(good, two)
    (two / "config.json").write_text(json.dumps({**cfg, "id2label": {"0": "a", "1": "b"},
                                                 "label2id": {"a": 0, "b": 1}}))
    with pytest.raises(HarnessError, match="2 labels"):
        check_checkpoint(two)

    small = tmp_path / "small-vocab"
    shutil.copytree(good, small)
    (small / "config.json").write_text(json.dumps({**cfg, "vocab_size": 3}))
    with pytest.raises(HarnessError, match="tokenizer does not match the model"):
        check_checkpoint(small)

    with pytest.raises(HarnessError, match=r"no config\.json"):
        check_checkpoint(tmp_path)


def test_reward_input_refuses_a_wrong_or_changed_checkpoint_before_any_run(tmp_path):
    checkpoint = save_reward_model(tmp_path / "rm", ["1>1", "2>2"])
    config = small_config(path=str(checkpoint), sha256="0" * 64)
    inputs = tmp_path / "inputs"
    build_dataset(config, inputs)
    build_policy(config, inputs)
    with pytest.raises(HarnessError, match=r"config: at reward.sha256: .* not 0{64}"):
        build_reward(config, inputs)
    assert not (inputs / "reward").exists()  # nothing half-built is left to look complete

    config["reward"]["sha256"] = None
    digest = build_reward(config, inputs)
    assert len(digest) == 64 and resolve_inputs(inputs)["reward"]["kind"] == "model"
    with torch.no_grad():  # the linked checkpoint changes after the input was built
        from transformers import AutoModelForSequenceClassification

        model = AutoModelForSequenceClassification.from_pretrained(checkpoint)
        model.score.weight.add_(1.0)
        model.save_pretrained(checkpoint)
    with pytest.raises(HarnessError,
                       match=r"reward model .*sha256 .* the checkpoint changed after the input was built"):
        resolve_inputs(inputs)


@pytest.mark.e2e
def test_pipeline_with_a_reward_model_records_it_in_every_manifest_and_logs_task_accuracy(tmp_path):
    profile = tmp_path / "rm.yaml"
    profile.write_text(yaml.safe_dump({"profile": "micro-rm", "reward": {"kind": "model", "train": {"steps": 20}}}))
    proc = snakemake(tmp_path, "--cores", "2", "--configfile", REPO / "workflows" / "config" / "micro.yaml", profile)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = tmp_path / "results"
    record = json.loads((results / "inputs" / "reward" / "reward.json").read_text())
    for seed in (1, 2):
        manifest = json.loads((results / "runs" / "reference" / f"seed{seed}" / "manifest.json").read_text())
        assert manifest["inputs"]["reward"]["kind"] == "model"
        assert manifest["inputs"]["reward"]["sha256"] == record["sha256"]
    import pandas as pd

    summary = pd.read_csv(results / "summary.csv")
    assert summary["task_accuracy_last10"].between(0, 1).all()
    report = (results / "report" / "index.html").read_text()
    assert record["sha256"][:12] in report
