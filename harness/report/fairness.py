"""The fairness table read at a glance: each (setting, framework) row of tables.fairness_table in one class, and per
framework how many rows each class holds, shown before the full table (folded below it on the page).

Classes, in the order the summary shows them:
- work: the setting differs and changes the work a step does (batch, lengths, the generation rule, sampling,
  precision, the prompts): the throughput comparison is not like for like until it is fixed;
- cpu: a stand-in a CPU run forces (device, engine, attention kernel, weight sync...): the plan's deviation says so
  with a cause starting "CPU run:"; on a GPU profile these rows are not there;
- other: any other difference (KL placement, reward clipping, optimizer details...): what is learnt may differ,
  the work a step does does not;
- unmapped: the adapter does not map the key (or the framework has no plan), so whether it matches is not known;
- match: the framework's value is the shared spec's.
"""

from __future__ import annotations

import re

import pandas as pd

CLASSES = ("work", "cpu", "other", "unmapped", "match")
LABELS = {"work": "changes the step's work", "cpu": "CPU stand-in", "other": "other difference",
          "unmapped": "not mapped", "match": "same as the spec"}
CPU_CAUSE = "CPU run:"
# Settings whose difference changes what a step computes: how many prompts and responses, how long, how they are
# drawn and ended, in what precision, from which prompt text.
WORK_KEY = re.compile(r"batch|rollout_n|length|temperature|top_p|top_k|sampl|precision|dtype|bf16|fp16|"
                      r"^remax\.steps$|^task\.prompt$|short_responses")


def fairness_class(key: str, state: str, cause: str) -> str:
    """The class of one (setting, framework) row of the fairness table."""
    if state in ("not mapped", "unknown", "unmapped"):
        return "unmapped"
    if state != "mismatch":
        return "match"
    if CPU_CAUSE in (cause or ""):
        return "cpu"
    return "work" if WORK_KEY.search(key) else "other"


def classify(fair: pd.DataFrame) -> pd.Series:
    """Each row's class (tables.fairness_table's rows)."""
    return pd.Series([fairness_class(r.key, r.state, r.cause) for r in fair.itertuples()], index=fair.index,
                     dtype=object)


def fairness_summary(fair: pd.DataFrame, frameworks: list[str]) -> list[dict]:
    """Per framework shown in the table: the number of rows in each class, and the settings of the three classes a
    reader acts on (work, cpu, other) by name."""
    if fair.empty:
        return []
    classes = classify(fair)
    rows = []
    for fw in frameworks:
        mine = fair["framework"] == fw
        counts = {c: int(((classes == c) & mine).sum()) for c in CLASSES}
        keys = {c: ", ".join(fair.loc[(classes == c) & mine, "key"]) for c in ("work", "cpu", "other")}
        rows.append(dict(framework=fw, counts=counts, names=keys))
    return rows
