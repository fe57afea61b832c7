"""Every framework scored by the one shared reward model: each adapter's plan records the same checkpoint (sha256)
and how it scores (plan.json "reward"), a bad checkpoint stops every plan before any run, and the report's
reward table shows it per framework, flagging frameworks scored by different rewards."""

import json
import shutil

import pytest
import torch
from reward_inputs import model_reward_inputs

from harness import HarnessError
from harness.frameworks.dschat import plan as dschat_plan
from harness.frameworks.openrlhf import plan as openrlhf_plan
from harness.frameworks.verl import plan as verl_plan
from harness.inputs import build_reward, resolve_reward
from harness.report.page import environment, reward_view
from harness.report.runs import Run
from harness.report.tables import reward_table

ADAPTERS = {"verl": verl_plan, "openrlhf": openrlhf_plan, "dschat": dschat_plan}


@pytest.fixture(scope="module")
def model_inputs(tmp_path_factory):
    return model_reward_inputs(tmp_path_factory.mktemp("model-reward"))


@pytest.fixture(scope="module")
def plans(model_inputs, tmp_path_factory):
    root = tmp_path_factory.mktemp("plans")
    out = {}
    for name, module in ADAPTERS.items():
        module.plan(model_inputs["config"], 1, root / name, model_inputs["inputs"])
        out[name] = json.loads((root / name / "plan.json").read_text())
    return out


def test_every_plan_records_the_same_checkpoint_served(plans, model_inputs):
    shared = resolve_reward(model_inputs["inputs"])
    for name, plan in plans.items():
        assert plan["reward"] == {"kind": "model", "checkpoint": shared["path"], "sha256": shared["sha256"],
                                  "scored_by": "served"}, name


def _own_inputs(model_inputs, tmp_path):
    """A private copy of the checkpoint and the inputs built from it, to break without touching the shared ones."""
    checkpoint = shutil.copytree(model_inputs["checkpoint"], tmp_path / "ckpt")
    inputs = shutil.copytree(model_inputs["inputs"], tmp_path / "inputs", symlinks=True)
    config = json.loads(json.dumps(model_inputs["config"]))
    config["reward"]["path"] = str(checkpoint)
    build_reward(config, inputs)
    return config, checkpoint, inputs


@pytest.mark.parametrize("name", list(ADAPTERS))
def test_a_checkpoint_changed_after_the_inputs_were_built_stops_the_plan(model_inputs, tmp_path, name):
    config, checkpoint, inputs = _own_inputs(model_inputs, tmp_path)
    recorded = resolve_reward(inputs)["sha256"]
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(checkpoint)
    with torch.no_grad():
        model.score.weight += 1.0  # other weights, same format: only the hash tells
    model.save_pretrained(checkpoint)
    with pytest.raises(HarnessError) as e:
        ADAPTERS[name].plan(config, 1, tmp_path / "plan", inputs)
    assert f"reward model {inputs / 'reward' / 'model'}" in str(e.value) and f"records {recorded}" in str(e.value)
    assert not (tmp_path / "plan").exists()


def _broken_checkpoint_input(model_inputs, tmp_path, edit):
    """The reward input built from a private copy of the checkpoint after `edit` broke it."""
    checkpoint = shutil.copytree(model_inputs["checkpoint"], tmp_path / "ckpt")
    edit(checkpoint)
    inputs = shutil.copytree(model_inputs["inputs"], tmp_path / "inputs", symlinks=True)
    shutil.rmtree(inputs / "reward")
    (inputs / "reward.sha256").unlink()
    config = json.loads(json.dumps(model_inputs["config"]))
    config["reward"]["path"] = str(checkpoint)
    with pytest.raises(HarnessError) as e:
        build_reward(config, inputs)  # the pipeline's `reward` rule: before any plan or run
    assert not (inputs / "reward").exists()
    return str(e.value)


def test_a_tokenizer_that_does_not_fit_the_model_stops_the_reward_input(model_inputs, tmp_path):
    def more_tokens(checkpoint):
        tokenizer = checkpoint / "tokenizer.json"
        tokenizer.write_text(tokenizer.read_text().replace("<pad>", "<PAD>"))  # one token more than the embedding

    assert "the tokenizer does not match the model: it has 17 tokens, the model's embedding only 16" in \
        _broken_checkpoint_input(model_inputs, tmp_path, more_tokens)


def test_a_checkpoint_that_is_not_a_sequence_classifier_stops_the_reward_input(model_inputs, tmp_path):
    def causal_lm(checkpoint):
        cfg = json.loads((checkpoint / "config.json").read_text())
        (checkpoint / "config.json").write_text(json.dumps({**cfg, "architectures": ["LlamaForCausalLM"]}))

    assert ("architectures ['LlamaForCausalLM'] in config.json; a reward model must be a "
            "*ForSequenceClassification checkpoint") in _broken_checkpoint_input(model_inputs, tmp_path, causal_lm)


def reward_html(table):
    """The page's reward section on its own: its template macro on the page's view of the table."""
    return str(environment().get_template("tables.html.j2").module.reward(reward_view(table)))


def test_report_reward_table(plans, model_inputs):
    shared = resolve_reward(model_inputs["inputs"])
    runs = [Run(name, seed, plan={**plan, "seed": seed}) for name, plan in plans.items() for seed in (1, 2)]
    # The reference backend records the reward input it scored with in its manifest (inputs.reward).
    runs += [Run("reference", 1, manifest={"inputs": {"reward": shared}}), Run("nothing", 1)]
    table = reward_table(runs)
    assert list(table["framework"]) == ["verl", "openrlhf", "dschat", "reference"]
    assert set(table["sha256"]) == {shared["sha256"]} and set(table["kind"]) == {"model"}
    assert list(table["scored_by"]) == ["served"] * 3 + ["in-process"]
    assert next(iter(table["seeds"])) == [1, 2]
    html = reward_html(table)
    assert "Every framework was scored by the same reward" in html and shared["sha256"][:12] in html
    assert html.count("<b>served</b>") == 3 and "mismatch" not in html

    # One framework scored by another checkpoint: said, and its row highlighted.
    other = {**plans["dschat"], "reward": {**plans["dschat"]["reward"], "sha256": "f" * 64, "scored_by": "in-process"}}
    table = reward_table(runs[:4] + [Run("dschat", 1, plan=other)])
    html = reward_html(table)
    assert "scored by 2 different rewards" in html
    assert html.count('<tr class="mismatch">') == 1 and "ffffffffffff" in html
