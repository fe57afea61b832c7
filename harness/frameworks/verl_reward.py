"""verl's custom reward function for the shared task: the one shared reward, harness.reward.score.

verl 0.9.1 loads this file by path (`reward.custom_reward_function.path`) inside its Ray reward workers and calls
`compute_score(data_source=..., solution_str=..., ground_truth=..., extra_info=...)` once per response, with
`solution_str` the decoded response only; the prompt travels in `extra_info["prompt"]` (written by the verl plan).
"""

import sys
from pathlib import Path

# Loaded by path in verl's own environment, where the harness is not installed: make the checkout importable.
# harness.reward (and harness/__init__) import nothing outside the standard library.
_REPO = str(Path(__file__).resolve().parents[2])
if _REPO not in sys.path:
    sys.path.insert(0, _REPO)

from harness.reward import score  # noqa: E402


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    if not extra_info or "prompt" not in extra_info:
        raise ValueError(f"{data_source}: extra_info lacks 'prompt' "
                         "(was the parquet written by `remax-bench plan verl`?)")
    return score(extra_info["prompt"], solution_str, ground_truth)
