"""The one reward every backend uses: `score(prompt, response, answer) -> float` in [0, 1].

The generated tasks' answers are plain numbers: partial credit is the fraction of answer digits right in their
place (aligned from the units digit), over the longer of the response and the answer, so padding, extra digits or
a memorised constant earn little; anything that is not a plain number scores 0. An answer in GSM8K's form (worked
solution, then "#### 72") is scored as verl scores GSM8K (verl/utils/reward_score/gsm8k.py, its strict method): the
last "#### number" in the response's final 300 characters, commas and dollar signs dropped, must equal the
answer's: 1 or 0. `correct` is the exact-match accuracy the summaries report.
"""

from __future__ import annotations

import re

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
