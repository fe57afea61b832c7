"""Planted changes in a clone of this repository, each caught and named by `remax-bench parity`: TRL's loss
aggregated by sequence mean instead of token mean, its KL term dropped from the reward, its gradient clip at 10
instead of the configured one. TRL's trainer (inside/remax_trl.py) is read from the clone's checkout, not installed,
so the clone runs in this checkout's TRL environment (REMAX_BENCH_ENVS: the description is the same, nothing is
rebuilt). The frameworks' own rows are in tests/test_parity_frameworks.py."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import clone_with_commit, make_inputs, parity_config

from harness.runtime.envs import ENV_ROOT

TRAINER = "harness/frameworks/trl/inside/remax_trl.py"


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("planted")
    raw = parity_config(None)
    raw["frameworks"] = ["reference", "trl"]
    path, _ = make_inputs(root, raw)
    return {"root": root, "config": path, "inputs": root / "inputs"}


PLANTED = {
    "sequence mean": (TRAINER, (
        'return -(inputs["advantages"].detach() * logps * mask).sum() / mask.sum().clamp(min=1)',
        'return -((inputs["advantages"].detach() * logps * mask).sum(-1) / mask.sum(-1).clamp(min=1)).mean()'),
        "trl: logprobs, ref_logprobs, advantages equal; loss differs: sequence mean of token means against the "
        "reference's token mean of -A log pi"),
    "KL dropped": (TRAINER, ("rewards = -kl_coef * (logps - ref_logps) * mask", "rewards = torch.zeros_like(mask)"),
                   "trl: logprobs, ref_logprobs equal; advantages differs: the KL term is left out of the reward"),
    "clip 10": (TRAINER, ("max_grad_norm=args.grad_clip", "max_grad_norm=10.0"),
                "trl: logprobs, ref_logprobs, advantages, loss, grad_norm equal; applied_grad_norm differs: not "
                "clipped (the applied norm is the norm before the clip), where the batch's clip is"),
}


@pytest.mark.parametrize("change", list(PLANTED))
def test_a_planted_change_in_a_clone_is_caught_and_named(change, inputs, tmp_path):
    """`remax-bench parity` from the clone, its --out relative (as the rule gives it; the drivers run elsewhere). The
    clone runs TRL from its own checkout (remax_trl.py is read from there, not installed), in this checkout's
    TRL environment (REMAX_BENCH_ENVS: the description is the same, so it is not rebuilt)."""
    path, line, named = PLANTED[change]
    clone = clone_with_commit(tmp_path / "repo", path, line, f"planted: {change}")
    proc = subprocess.run([sys.executable, "-m", "harness.cli", "parity", "--config", str(inputs["config"]),
                           "--inputs", str(inputs["inputs"]), "--frameworks", "trl", "--out", "../p"],
                          cwd=clone, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(clone), "REMAX_BENCH_ENVS": str(ENV_ROOT)})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1].startswith(named), proc.stdout
    assert (tmp_path / "p" / "parity.csv").is_file()  # --out relative to where it runs, as the pipeline's rule gives it
