"""The shared task: seeded multi-digit addition with a verifiable answer, written as canonical JSONL.

Addition is small enough for a CPU-sized policy to learn within minutes, yet every answer digit depends on
both operands (carries included), so the reward cannot be earned without doing the sum.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from harness import HarnessError
from harness.io import write_text

FIELDS = ("id", "prompt", "answer", "split")


def _addition(i: int, digits: int) -> tuple[str, str]:
    a, b = divmod(i, 10 ** digits)
    return f"{a}+{b}=", str(a + b)


def _reverse(i: int, digits: int) -> tuple[str, str]:
    s = str(i).zfill(2 * digits)
    return f"{s}>", s[::-1]


# kind -> (problem from its index, number of distinct problems for `digits`)
KINDS = {
    "addition": (_addition, lambda digits: 10 ** (2 * digits)),  # a+b=, both operands < 10**digits
    "reverse": (_reverse, lambda digits: 10 ** (2 * digits)),  # a 2*digits-digit string, written backwards
}


def generate(task: dict) -> list[dict]:
    """Distinct problems for train and eval (no problem is in both), identical for identical `task` config."""
    make, space = KINDS[task["kind"]]
    size = space(task["digits"])
    n = task["n_train"] + task["n_eval"]
    if n > size:
        raise HarnessError(f"task: n_train + n_eval = {n} exceeds the {size} distinct {task['kind']} problems "
                           f"of {task['digits']} digits")
    rows = []
    for k, i in enumerate(random.Random(task["seed"]).sample(range(size), n)):
        split = "train" if k < task["n_train"] else "eval"
        prompt, answer = make(i, task["digits"])
        rows.append({"id": f"{split}-{k:06d}", "prompt": prompt, "answer": answer, "split": split})
    return rows


def to_jsonl(rows: list[dict]) -> str:
    return "".join(json.dumps(r, sort_keys=True, separators=(",", ":")) + "\n" for r in rows)


def write_dataset(task: dict, dest: str | Path) -> None:
    write_text(dest, to_jsonl(generate(task)))


def read_dataset(path: str | Path) -> dict[str, list[dict]]:
    """Rows by split; every line must be a JSON object with exactly the canonical fields."""
    splits: dict[str, list[dict]] = {"train": [], "eval": []}
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise HarnessError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None
            if not isinstance(row, dict) or set(row) != set(FIELDS):
                raise HarnessError(f"{path}:{lineno}: expected an object with fields {', '.join(FIELDS)}")
            if row["split"] not in splits:
                raise HarnessError(f"{path}:{lineno}: unknown split {row['split']!r} (expected train or eval)")
            splits[row["split"]].append(row)
    for name, rows in splits.items():
        if not rows:
            raise HarnessError(f"{path}: the {name} split is empty")
    return splits
