"""Runs in verl's environment (verl-validate): verl's own ReMax advantage on harness.conformance.CASES, as JSON on
stdout; harness.frameworks.verl.conformance compares it with the reference.

The sampled scores go through verl's reward placement (RewardManagerBase.assemble_rm_scores is not importable
without aiohttp, so its one line is mirrored: score at index valid_response_length - 1), the KL through verl's
core_algos.kl_penalty and the fixed coefficient as ray_trainer.apply_kl_penalty applies it, the advantage through
the estimator verl registers as "remax", called with the keyword arguments ray_trainer.compute_advantage builds.
"""

import json
import sys

import numpy as np
import torch
from verl.trainer.config import AlgoConfig
from verl.trainer.ppo import core_algos

from harness.conformance import CASES


def main() -> None:
    fn = core_algos.get_adv_estimator_fn("remax")
    assert fn is core_algos.compute_remax_outcome_advantage
    out: dict[str, object] = {}
    for name, case in CASES.items():
        mask = torch.tensor(case["mask"], dtype=torch.float32)
        if "token_scores" in case:
            scores = torch.tensor(case["token_scores"], dtype=torch.float32) * mask
        else:
            scores = torch.zeros_like(mask)
            last = mask.sum(-1).long() - 1
            scores[torch.arange(len(mask)), last] = torch.tensor(case["scores"], dtype=torch.float32)
        kl = torch.tensor(case["kl"], dtype=torch.float32)
        kld = core_algos.kl_penalty(kl, torch.zeros_like(kl), kl_penalty="kl") * mask
        rewards = scores - core_algos.FixedKLController(kl_coef=case["kl_coef"]).value * kld
        kwargs = {"token_level_rewards": rewards, "response_mask": mask, "config": AlgoConfig(adv_estimator="remax"),
                  "index": np.array([str(i) for i in range(len(mask))], dtype=object)}
        adv, _ = fn(**kwargs, reward_baselines=torch.tensor(case["baselines"], dtype=torch.float32))
        out[name] = adv.tolist()
        if name == "outcome":
            try:  # a batch without reward_baselines, as ray_trainer.compute_advantage passes it on
                fn(**kwargs)
                out["missing_baseline"] = None
            except Exception as e:
                out["missing_baseline"] = f"{type(e).__name__}: {e}"
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
