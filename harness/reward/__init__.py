"""The one reward every backend uses: `score(prompt, response, answer) -> float` in [0, 1].

The generated tasks' answers are plain numbers: partial credit is the fraction of answer digits right in their
place (aligned from the units digit), over the longer of the response and the answer, so padding, extra digits or
a memorised constant earn little; anything that is not a plain number scores 0. An answer in GSM8K's form (worked
solution, then "#### 72") is scored as verl scores GSM8K (verl/utils/reward_score/gsm8k.py, its strict method): the
last "#### number" in the response's final 300 characters, commas and dollar signs dropped, must equal the
answer's: 1 or 0. `correct` is the exact-match accuracy the summaries report. `score_batch` scores a batch with
the rule here, or with the shared reward server (a reward model) where a framework's process is given its URL.

The frameworks' own environments import this module, so it imports the standard library only.
"""

from __future__ import annotations

import json
import re
import urllib.request

GSM8K_FINAL = re.compile(r"#### (\-?[0-9\.\,]+)")
_CLIP = 300  # verl's _SOLUTION_CLIP_CHARS


def final_number(text: str) -> str | None:
    """The number after the last "#### " (GSM8K's answer line), or None."""
    found = GSM8K_FINAL.findall(text[-_CLIP:])
    return found[-1].replace(",", "").replace("$", "") if found else None


def score(prompt: str, response: str, answer: str) -> float:
    if "####" in answer:
        guess = final_number(response)
        return float(guess is not None and guess == final_number(answer))
    guess = response.strip()
    if not guess.isdigit() or not guess.isascii():
        return 0.0
    width = max(len(guess), len(answer))
    hits = sum(g == a for g, a in zip(guess.rjust(width), answer.rjust(width)))
    return hits / width


def correct(response: str, answer: str) -> bool:
    if "####" in answer:
        guess = final_number(response)
        return guess is not None and guess == final_number(answer)
    return response.strip() == answer


def score_batch(prompts: list[str], responses: list[str], answers: list[str], url: str | None = None,
                timeout_s: float = 180) -> list[float]:
    """The shared reward of each response: `score` here, or the shared reward server at `url` (harness.reward.server:
    OpenRLHF's remote-reward protocol, query = prompt + response)."""
    if not url:
        return [score(p, r, a) for p, r, a in zip(prompts, responses, answers)]
    body = json.dumps({"query": [p + r for p, r in zip(prompts, responses)], "prompts": prompts,
                       "labels": answers}).encode()
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout_s) as resp:
        rewards = json.loads(resp.read())["rewards"]
    if len(rewards) != len(prompts):
        raise RuntimeError(f"shared reward server {url}: {len(rewards)} rewards for {len(prompts)} responses")
    return [float(r) for r in rewards]
