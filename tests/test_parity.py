"""Update parity's own parts, on a real batch from the shared inputs and the reference's real update: the batch, the
comparison's verdicts and causes, the refusals. The frameworks' drivers run in tests/test_parity_frameworks.py."""

from __future__ import annotations

import pytest
import torch
from conftest import make_inputs, run_cli, tiny_cpu_config

from harness import HarnessError, remax
from harness.frameworks.reference import backend
from harness.inputs.policy import load_policy
from harness.parity import ACTOR, BATCH, KL_PROBE, read_batch, reference_update, write_batch
from harness.parity.compare import compare, summary


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    root = tmp_path_factory.mktemp("parity")
    _, config = make_inputs(root, tiny_cpu_config())
    write_batch(config, root / "inputs", root / "batch")
    model, _ = load_policy(root / "batch" / ACTOR)
    start = {k: p.detach().clone() for k, p in model.named_parameters()}
    tensors, settings = read_batch(root / "batch")
    return {"dir": root / "batch", "tensors": tensors, "settings": settings, "start": start,
            "ref": reference_update(root / "batch"), "config": config, "root": root}


def verdicts(rows):
    return {r["quantity"]: r["verdict"] for r in rows}


def test_the_batch_makes_every_term_of_the_update_act(batch):
    """The actor is not the KL anchor (the KL term is not zero) and the clip acts (the applied norm is the clip)."""
    ref, rc, mask = batch["ref"], batch["settings"]["remax"], batch["tensors"]["response_mask"]
    assert rc["kl_coef"] == max(batch["config"]["remax"]["kl_coef"], KL_PROBE)
    assert float(((ref["logprobs"] - ref["ref_logprobs"]) * mask).abs().sum()) > 0
    assert ref["grad_norm"] > rc["grad_clip"] and ref["applied_grad_norm"] == pytest.approx(rc["grad_clip"], rel=1e-4)
    rows = compare("reference", ref, ref, batch["tensors"], batch["settings"], batch["start"])
    assert set(verdicts(rows).values()) == {"match"}
    assert summary(rows).startswith("the same update")


def _variant(batch, *, loss=None, kl_coef=None, clip=None, lr=None) -> dict:
    """The reference's update on the batch with one piece of the ReMax update changed, as a framework might have it."""
    rc = {**batch["settings"]["remax"], **({} if clip is None else {"grad_clip": clip}),
          **({} if lr is None else {"lr": lr}), **({} if kl_coef is None else {"kl_coef": kl_coef})}
    original = remax.policy_gradient_loss
    if loss is not None:
        backend.remax.policy_gradient_loss = loss
    try:
        return reference_update(batch["dir"], remax=rc)
    finally:
        backend.remax.policy_gradient_loss = original


def test_a_sequence_mean_loss_is_named(batch):
    def sequence_mean(logprobs, advantages, mask):
        return (-(advantages.detach() * logprobs * mask).sum(-1) / mask.sum(-1).clamp(min=1)).mean()

    rows = compare("f", _variant(batch, loss=sequence_mean), batch["ref"], batch["tensors"], batch["settings"],
                   batch["start"])
    assert verdicts(rows)["advantages"] == "match" and verdicts(rows)["loss"] == "differs"
    assert "; loss differs: sequence mean of token means against the reference's token mean of -A log pi;" in \
        summary(rows)


def test_a_dropped_kl_term_is_named(batch):
    rows = compare("f", _variant(batch, kl_coef=0.0), batch["ref"], batch["tensors"], batch["settings"],
                   batch["start"])
    assert summary(rows).startswith("logprobs, ref_logprobs equal; advantages differs: the KL term is left out of the "
                                    "reward;")


def test_another_clip_shows_in_the_applied_gradient_only(batch):
    """Clip 10 where the batch says less than the gradient's norm: the same gradient, not clipped. Adam's first step
    is invariant to the gradient's scale, so the weights' update cannot show it: the applied norm does."""
    rows = compare("f", _variant(batch, clip=10.0), batch["ref"], batch["tensors"], batch["settings"], batch["start"])
    v = verdicts(rows)
    assert v["grad_norm"] == "match" and v["applied_grad_norm"] == "differs" and v["update"] == "match"
    assert "not clipped" in next(r["note"] for r in rows if r["quantity"] == "applied_grad_norm")


def test_another_learning_rate_shows_in_the_update(batch):
    rows = compare("f", _variant(batch, lr=batch["settings"]["remax"]["lr"] * 2), batch["ref"], batch["tensors"],
                   batch["settings"], batch["start"])
    update = next(r for r in rows if r["quantity"] == "update")
    assert update["verdict"] == "differs" and "norm ratio 2.0" in update["note"]


def test_a_damaged_batch_is_refused_by_name(batch, tmp_path):
    import shutil

    damaged = tmp_path / "batch"
    shutil.copytree(batch["dir"], damaged)
    (damaged / BATCH).write_bytes(b"not a torch file")
    with pytest.raises(HarnessError, match=f"{damaged / BATCH}: not a parity batch"):
        read_batch(damaged)
    shutil.rmtree(damaged / ACTOR)
    with pytest.raises(HarnessError, match="no actor"):
        read_batch(damaged)


def test_parity_of_a_config_without_a_driver_exits_2(batch):
    cfg = batch["root"] / "reference-only.yaml"
    cfg.write_text((batch["root"] / "config.yaml").read_text().replace(
        "- reference\n- verl\n- openrlhf\n- dschat\n- trl\n", "- reference\n"))
    proc = run_cli("parity", "--config", cfg, "--inputs", batch["root"] / "inputs", "--out", batch["root"] / "p")
    assert proc.returncode == 2 and "none of reference has a parity driver" in proc.stderr
    assert not (batch["root"] / "p").exists()
    assert torch.equal(batch["tensors"]["response_mask"], read_batch(batch["dir"])[0]["response_mask"])
