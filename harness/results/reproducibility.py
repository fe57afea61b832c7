"""Whether a run reproduces: a repeat against its original, step by step, and the spread between repeats of one seed
beside the spread between seeds (docs/reproducibility.md).

Two runs of one plan compare on what they computed, never on how long it took: the behaviour columns of the common
schema (rewards, KL, token counts, lengths, accuracy). Identical means bitwise equal on every one of them at every
step; otherwise the first divergence is the earliest step, and in it the first of BEHAVIOUR, that differs.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from harness import HarnessError
from harness.results.summarize import edge_means, read_eval, reward_curve

BEHAVIOUR = ("reward_mean", "reward_baseline_mean", "kl_mean", "tokens_prompt", "tokens_response", "tokens_baseline",
             "response_length_mean", "task_accuracy_mean")


def _same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


def first_divergence(original: pd.DataFrame, repeat: pd.DataFrame) -> dict | None:
    """{step, metric, original, repeat} at the first step where the repeat computed something else; None when every
    step's behaviour is bitwise equal. A step one run has and the other lacks diverges on "step"."""
    a, b = original.set_index("step"), repeat.set_index("step")
    for step in sorted(set(a.index) | set(b.index)):
        if step not in a.index or step not in b.index:
            return {"step": int(step), "metric": "step", "original": bool(step in a.index),
                    "repeat": bool(step in b.index)}
        for metric in BEHAVIOUR:
            x, y = float(a.at[step, metric]), float(b.at[step, metric])
            if not _same(x, y):
                return {"step": int(step), "metric": metric, "original": x, "repeat": y}
    return None


def verdict_text(divergence: dict | None) -> str:
    if divergence is None:
        return "identical"
    if divergence["metric"] == "step":
        only = "the original" if divergence["original"] else "the repeat"
        return f"diverged at step {divergence['step']}: only {only} has it"
    return (f"diverged at step {divergence['step']} on {divergence['metric']} "
            f"({divergence['original']!r} against {divergence['repeat']!r})")


def run_figures(steps: pd.DataFrame, eval_path: Path | None, warmup_steps: int) -> dict:
    """The figures a reader compares runs by: final reward, eval greedy accuracy, tokens/s, the reward curve."""
    measured = steps[steps["step"] > warmup_steps]
    evaluation = read_eval(eval_path) if eval_path is not None and eval_path.is_file() else None
    return {"final_reward": edge_means(steps.sort_values("step")["reward_mean"])[1],
            "eval_accuracy": evaluation["eval_accuracy_after"] if evaluation else math.nan,
            "tokens_per_s": float(measured["throughput_tok_s"].median()),
            "curve": reward_curve(steps).set_index("step")["reward"]}


def _curve_gap(a: pd.Series, b: pd.Series) -> float:
    gap = (a - b).abs().dropna()
    return float(gap.max()) if len(gap) else math.nan


def _largest(pairs: list[tuple[dict, dict]], figure: str) -> float:
    gaps = [(_curve_gap(x["curve"], y["curve"]) if figure == "curve" else abs(x[figure] - y[figure]))
            for x, y in pairs]
    gaps = [g for g in gaps if not math.isnan(g)]
    return max(gaps) if gaps else math.nan


FIGURES = {"curve": "reward curve (largest gap of the trailing mean)", "final_reward": "final reward",
           "eval_accuracy": "eval greedy accuracy", "tokens_per_s": "tokens/s"}


def spread_rows(originals: dict[int, dict], repeats: dict[int, list[dict]]) -> list[dict]:
    """One row per figure: the largest difference between a repeat and its original (run-to-run noise of one seed)
    beside the largest difference between two seeds' originals (seed noise)."""
    seeds = sorted(originals)
    seed_pairs = [(originals[a], originals[b]) for i, a in enumerate(seeds) for b in seeds[i + 1:]]
    repeat_pairs = [(originals[s], r) for s, rs in repeats.items() for r in rs]
    return [{"figure": label, "between_repeats": _largest(repeat_pairs, figure),
             "between_seeds": _largest(seed_pairs, figure)} for figure, label in FIGURES.items()]


def greedy_responses(evaluation: dict, where: str | Path) -> dict[str, str] | None:
    """{prompt: greedy response} of the eval record's pass before training (eval.json's before.responses); None where
    the framework's evaluation keeps no responses."""
    rows = evaluation.get("before", {}).get("responses")
    if rows is None:
        return None
    if not isinstance(rows, list) or not all(
            isinstance(r, dict) and isinstance(r.get("prompt"), str) and isinstance(r.get("response"), str)
            for r in rows):
        raise HarnessError(f"{where}: before.responses is not a list of {{prompt, response}} strings")
    return {r["prompt"].strip(): r["response"].strip() for r in rows}


def step0_agreement(reference: dict[str, str], responses: dict[str, str]) -> dict:
    """How many eval prompts a framework answers, before training, with the reference backend's greedy response:
    {"n", "agree", "missing", "first"}; "first" is the first prompt (in the reference's order) answered otherwise, with
    both responses, or None. The policy, prompts and decoding are the same, so a difference is in how the framework
    loads, pads, tokenizes or computes, and it is caught before its throughput is compared."""
    agree, missing, first = 0, 0, None
    for prompt, expected in reference.items():
        got = responses.get(prompt)
        if got is None:
            missing += 1
        elif got == expected:
            agree += 1
        elif first is None:
            first = {"prompt": prompt, "reference": expected, "framework": got}
    return {"n": len(reference), "agree": agree, "missing": missing, "first": first}
