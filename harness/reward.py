"""The one reward every backend uses: `score(prompt, response, answer) -> float` in [0, 1].

Partial credit is the fraction of answer digits right in their place (aligned from the units digit), over
the longer of the response and the answer, so padding, extra digits or a memorised constant earn little;
anything that is not a plain number scores 0. `correct` is the exact-match accuracy the summaries report.
"""

from __future__ import annotations


def score(prompt: str, response: str, answer: str) -> float:
    guess = response.strip()
    if not guess.isdigit() or not guess.isascii():
        return 0.0
    width = max(len(guess), len(answer))
    hits = sum(g == a for g, a in zip(guess.rjust(width), answer.rjust(width)))
    return hits / width


def correct(response: str, answer: str) -> bool:
    return response.strip() == answer
