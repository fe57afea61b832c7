"""verl's custom reward functions for the shared task: the one shared reward, in-process or from the reward server.

verl 0.9.1 loads this file by path (`reward.custom_reward_function.path`, `.name` picks the function) inside its
reward-loop workers and calls `compute_score(data_source=..., solution_str=..., ground_truth=..., extra_info=...)`
once per response, with `solution_str` the decoded response only; the prompt travels in `extra_info["prompt"]`
(written by the verl plan).

Both return verl's dict form, {"score": the shared reward, "acc": the task's exact match (0 or 1)}: verl trains on
"score" and reports "acc" as its core validation metric (`val-core/<data_source>/acc/mean@1`, ray_trainer.py
_val_metrics_update), which is the eval greedy accuracy the harness reads (harness.frameworks.verl.ingest.evaluation).
Given a plain number, verl would report that number as "acc" (reward_loop/reward_manager/naive.py).

- `compute_score` (reward.kind rule): harness.reward.score, in verl's own process.
- `compute_score_served` (reward.kind model): the shared reward server that launch.sh starts, at the URL it
  exports in $REMAX_BENCH_REWARD_URL (Ray's local workers inherit the launching shell's environment, as verl's
  own constants_ppo.get_ppo_ray_runtime_env relies on). verl's NaiveRewardManager runs a plain function in its
  event loop's thread pool and awaits every response of a batch at once (reward_loop.py compute_score_batch), so
  the requests of a batch reach the server together, where they are scored in shared forward passes.
"""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

# Loaded by path in verl's own environment, where the harness is not installed: make the checkout importable.
# harness.reward (and harness/__init__) import nothing outside the standard library.
_REPO = str(Path(__file__).resolve().parents[4])
if _REPO not in sys.path:
    sys.path.insert(0, _REPO)

from harness.reward import correct, score  # noqa: E402

URL_VAR = "REMAX_BENCH_REWARD_URL"  # = harness.frameworks.reward_serving.URL_VAR (not importable here: no pandas)
REQUEST_TIMEOUT_S = 180  # as OpenRLHF's remote-reward client
BUSY = (429, 503)  # the server's answer while its queue is full: wait and ask again
BUSY_DEADLINE_S = 600


def _prompt(data_source: str, extra_info: dict[str, Any] | None) -> str:
    if not extra_info or "prompt" not in extra_info:
        raise ValueError(f"{data_source}: extra_info lacks 'prompt' "
                         "(was the parquet written by `remax-bench plan verl`?)")
    return extra_info["prompt"]


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: dict[str, Any] | None = None,
                  **kwargs: Any) -> dict[str, float]:
    return {"score": score(_prompt(data_source, extra_info), solution_str, ground_truth),
            "acc": float(correct(solution_str, ground_truth))}


def compute_score_served(data_source: str, solution_str: str, ground_truth: str,
                         extra_info: dict[str, Any] | None = None, **kwargs: Any) -> dict[str, float]:
    url = os.environ.get(URL_VAR)
    if not url:
        raise RuntimeError(f"${URL_VAR} is not set: run verl through the planned launch.sh, which starts the shared "
                           "reward server and exports its URL")
    prompt = _prompt(data_source, extra_info)
    # The shared reward server's protocol (OpenRLHF's remote reward): query = prompt + response.
    body = json.dumps({"query": [prompt + solution_str], "prompts": [prompt], "labels": [ground_truth]}).encode()
    deadline, wait = time.monotonic() + BUSY_DEADLINE_S, 0.05
    while True:
        request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as resp:
                answer = json.loads(resp.read())
                return {"score": float(answer["rewards"][0]), "acc": float(answer["extra_logs"]["exact_match"][0])}
        except urllib.error.HTTPError as e:
            if e.code not in BUSY or time.monotonic() > deadline:
                raise RuntimeError(f"shared reward server {url}: HTTP {e.code}: {e.read()[:500]!r}") from None
        time.sleep(wait)
        wait = min(wait * 2, 5.0)
