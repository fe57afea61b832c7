"""Shared test vectors for ReMax advantage conformance, and the reference side of every comparison.

Each framework adapter runs its framework's own advantage code (imported from the installed framework, in the
framework's environment) on these vectors and reports the difference from `reference_advantages` in one table
(columns: framework, case, max_abs_diff, verdict, note) that the report shows. Differences are reported, not hidden.
Vectors are plain lists so they cross process boundaries as JSON. The frameworks' own environments import this
module (OpenRLHF's validation, verl's), so it imports torch and harness.remax only: not the registry.
"""

from __future__ import annotations

from typing import Any

import torch

from harness.remax import remax_advantages, token_level_rewards

# What `remax-bench conformance` writes: each framework's advantage on these cases (harness.io.WRITTEN).
TABLE_ROLE = "conformance table"
# Each case: 2-3 responses with masks (1 = response token incl. EOS), the task score per response (outcome cases)
# or per token (dense case), the greedy baseline per response, per-token KL and its coefficient.
CASES: dict[str, dict[str, Any]] = {
    "outcome": {
        "description": "outcome reward on the last response token, no KL",
        "mask": [[1, 1, 1, 0], [1, 1, 1, 1], [1, 0, 0, 0]],
        "scores": [0.5, 1.0, 0.0],
        "baselines": [1.0, 0.25, 0.0],
        "kl": [[0.0] * 4] * 3,
        "kl_coef": 0.0,
    },
    "outcome_kl_in_reward": {
        "description": "outcome reward with the per-token KL penalty in the reward (k1, coefficient 0.1)",
        "mask": [[1, 1, 1, 0], [1, 1, 1, 1], [1, 0, 0, 0]],
        "scores": [0.5, 1.0, 0.0],
        "baselines": [1.0, 0.25, 0.0],
        "kl": [[0.2, -0.4, 1.0, 9.0], [0.1, 0.1, 0.1, 0.1], [0.3, 5.0, 5.0, 5.0]],
        "kl_coef": 0.1,
    },
    "dense": {
        "description": "dense per-token reward (multi-turn style): scores on several tokens, baseline = greedy total",
        "mask": [[1, 1, 1, 0], [1, 1, 1, 1]],
        "token_scores": [[0.25, 0.0, 0.5, 0.0], [0.0, 0.5, 0.0, 0.5]],
        "baselines": [0.5, 1.0],
        "kl": [[0.0] * 4] * 2,
        "kl_coef": 0.0,
    },
}


def case_tensors(case: dict) -> dict[str, torch.Tensor]:
    """The case as tensors: mask, token-level rewards (scores placed and KL subtracted), baselines."""
    mask = torch.tensor(case["mask"], dtype=torch.float32)
    kl = torch.tensor(case["kl"], dtype=torch.float32)
    if "token_scores" in case:
        rewards = torch.tensor(case["token_scores"], dtype=torch.float32) * mask - case["kl_coef"] * kl * mask
    else:
        rewards = token_level_rewards(torch.tensor(case["scores"], dtype=torch.float32), kl, mask, case["kl_coef"])
    return {"mask": mask, "token_rewards": rewards, "baselines": torch.tensor(case["baselines"], dtype=torch.float32)}


def reference_advantages(case: dict) -> torch.Tensor:
    t = case_tensors(case)
    return remax_advantages(t["token_rewards"], t["baselines"], t["mask"])



# The one tolerance of a match: float32 sums of a handful of terms per token agree to it in any order. (OpenRLHF's
# estimator on the shared vectors alone needs its own looser one: harness/frameworks/openrlhf/conformance.py,
# TOLERANCE.)
TOLERANCE = 1e-6


def verdict(max_abs_diff: float) -> str:
    return "match" if max_abs_diff <= TOLERANCE else "differs"
