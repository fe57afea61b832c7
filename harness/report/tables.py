"""The report's tables as data frames, computed from the runs (harness/report/runs.py), and the shared comparison
table in Markdown. Per run: the common-schema metrics after warm-up (harness.results.summarize); per framework: the
median over seeds with the min-max spread."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from harness import HarnessError
from harness.report.runs import Run, adapter_of
from harness.results import layout
from harness.results.metrics import FRAMEWORK_THROUGHPUT
from harness.results.summarize import by_framework, edge_means, reward_curve, time_to_reward

PARTS = (("time_gen_s", "generation"), ("time_transition_s", "transition"), ("time_train_s", "training"))

# Captions shown both in throughput.md and on the page.
NO_COMPLETED_RUN = "No completed run."
TOKENS_PER_S_DEFINITION = (
    "tokens/s = (prompt + sampled-response tokens of the global batch) / RL iteration time, aggregate over the"
    " run's accelerators (HybridFlow's definition), median over measured steps (after warm-up) per run, then median"
    " over seeds. Greedy baseline tokens are generated inside the step but not counted (as verl's own figure)."
    " Generation-only and training-only: the same tokens over the generation (sampled + greedy) or actor-update time"
    " alone. GPUs = 0: CPU run, no per-GPU figure. MFU: the model FLOPs of the step's tokens (PaLM's count;"
    " harness/results/efficiency.py) per second over the run's peak (GPUs: data-sheet bf16 peak; the reference on a"
    " CPU: its measured fp32 matmul rate), median over measured steps, then over seeds; empty where the peak is"
    " unknown."
)


def fmt(x: float | None, digits: int = 0) -> str:
    """A number as the report prints it: thousands separated, n/a when missing."""
    return "n/a" if x is None or pd.isna(x) else f"{x:,.{digits}f}"


def _run_extras(df: pd.DataFrame, warmup: int) -> dict:
    """Phase-only throughputs and the mean step-time breakdown over the measured steps of one run."""
    m = df[df["step"] > warmup]
    tokens = m["tokens_prompt"] + m["tokens_response"]
    parts = {name: m[col].fillna(0.0).mean() for col, name in PARTS}
    # A phase a framework does not time (NaN) or rounds to 0 has no throughput of its own.
    phase = {k: (tokens / m[col].where(m[col] > 0)).median() for k, col in (("gen", "time_gen_s"),
                                                                            ("train", "time_train_s"))}
    return {
        "gen_tok_s": float(phase["gen"]),
        "train_tok_s": float(phase["train"]),
        "transition_exposed": bool(m["time_transition_s"].notna().any()),
        **{f"mean_{name}_s": float(v) for name, v in parts.items()},
        "mean_other_s": float(max(0.0, m["time_step_s"].mean() - sum(parts.values()))),
        "mean_step_s": float(m["time_step_s"].mean()),
    }


def run_table(runs: list[Run], warmup: int) -> pd.DataFrame:
    rows = [{**r.summary, **_run_extras(r.metrics, warmup)} for r in runs if r.status == "ok"]
    return pd.DataFrame(rows)


def throughput_table(per_run: pd.DataFrame) -> pd.DataFrame:
    """by_framework's shared-table form, plus generation-only and training-only throughput, transition p90 and MFU."""
    if per_run.empty:
        return pd.DataFrame()
    for col in ("eval_accuracy_before", "eval_accuracy_after", "mfu_step", "mfu_gen", "mfu_train"):
        if col not in per_run:
            per_run = per_run.assign(**{col: np.nan})
    table = by_framework(per_run)
    extra = per_run.groupby("framework").agg(
        gen_tokens_per_s=("gen_tok_s", "median"), gen_tokens_per_s_min=("gen_tok_s", "min"),
        gen_tokens_per_s_max=("gen_tok_s", "max"),
        train_tokens_per_s=("train_tok_s", "median"), train_tokens_per_s_min=("train_tok_s", "min"),
        train_tokens_per_s_max=("train_tok_s", "max"),
        transition_s_p90=("time_transition_s_p90", "median"),
        **{c: (c, "median") for c in ("mfu_step", "mfu_gen", "mfu_train")},
    ).reset_index()
    return table.merge(extra, on="framework", how="left")


def mfu_words(r: Any) -> str:  # a row of DataFrame.itertuples(): a namedtuple of the table's columns
    """The MFU of a throughput-table row: step (generation / training), '-' where the peak is unknown."""
    if pd.isna(r.mfu_step):
        return "-"
    return f"{r.mfu_step:.1%} ({r.mfu_gen:.1%} / {r.mfu_train:.1%})"


def throughput_markdown(table: pd.DataFrame) -> str:
    """The shared comparison table's form (framework, tokens/s, relative to the slowest), with spread over seeds."""
    if table.empty:
        return NO_COMPLETED_RUN + "\n"
    lines = [
        "| framework | version | GPUs | seeds | tokens/s (median) | min-max over seeds | tokens/s per GPU | relative |"
        " generation-only tokens/s | training-only tokens/s | transition s (median / p90) | reward gain |"
        " eval acc. before -> after | MFU step (gen / train) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    for r in table.itertuples():
        lines.append(
            f"| {r.framework} | {r.framework_version} | {r.n_gpus} | {r.seeds} | {fmt(r.tokens_per_s)} |"
            f" {fmt(r.tokens_per_s_min)}-{fmt(r.tokens_per_s_max)} | {fmt(r.tokens_per_s_per_gpu)} |"
            f" {r.relative:.2f}x | {fmt(r.gen_tokens_per_s)} | {fmt(r.train_tokens_per_s)} |"
            f" {fmt(r.transition_s_median, 4)} / {fmt(r.transition_s_p90, 4)} | {fmt(r.reward_gain, 3)} |"
            f" {fmt(r.eval_accuracy_before, 3)} -> {fmt(r.eval_accuracy_after, 3)} | {mfu_words(r)} |"
        )
    return "\n".join(lines) + "\n\n" + TOKENS_PER_S_DEFINITION + "\n"


def step_time_table(per_run: pd.DataFrame) -> pd.DataFrame:
    """Per framework: transition and step time (medians over steps per run, then over seeds) and the transition's
    share of the mean step; the transition figures are NaN where the framework does not time it (not exposed)."""
    columns = ["framework", "exposed", "transition_s_median", "transition_s_p90", "step_s_median",
               "transition_share_pct"]
    if per_run.empty:
        return pd.DataFrame(columns=columns)
    rows = []
    for fw, g in per_run.groupby("framework", sort=False):
        exposed = bool(g["transition_exposed"].any())
        rows.append({"framework": fw, "exposed": exposed,
                     "transition_s_median": g["time_transition_s_median"].median() if exposed else math.nan,
                     "transition_s_p90": g["time_transition_s_p90"].median() if exposed else math.nan,
                     "step_s_median": g["time_step_s_median"].median(),
                     "transition_share_pct": 100 * g["mean_transition_s"].mean() / g["mean_step_s"].mean()
                     if exposed else math.nan})
    return pd.DataFrame(rows, columns=columns)


def eval_accuracy(per_run: pd.DataFrame) -> pd.DataFrame:
    """Greedy eval accuracy before and after training, median over seeds, by framework (empty: nothing evaluated)."""
    if "eval_accuracy_before" not in per_run:
        return pd.DataFrame()
    return per_run.groupby("framework")[["eval_accuracy_before", "eval_accuracy_after"]].median().dropna(how="all")


def time_to_reward_table(runs: list[Run], fraction: float) -> tuple[pd.DataFrame, float]:
    """Wall time until a run's trailing mean reward (harness.results.summarize.reward_curve, the curve the
    regression check's time-to-reward reads too) reaches `fraction` of the best framework's final reward.

    Final reward: mean of the last 10% of a run's steps, median over seeds; the trailing mean uses the same
    window, so a run 'reaches' the target in the same sense the best one ended there.
    """
    ok = [r for r in runs if r.status == "ok"]
    if not ok:
        return pd.DataFrame(), math.nan
    finals = pd.DataFrame([(r.framework, r.summary["reward_last10"]) for r in ok], columns=["framework", "final"])
    best = finals.groupby("framework")["final"].median().max()
    target = fraction * best if best > 0 else math.nan
    rows = []
    for r in ok:
        reached = time_to_reward(reward_curve(r.steps), target) if not math.isnan(target) else None
        time_s, step = reached or (math.nan, math.nan)
        rows.append({"framework": r.framework, "seed": r.seed, "final": r.summary["reward_last10"],
                     "time_s": time_s, "step": step})
    per_run = pd.DataFrame(rows)
    table = per_run.groupby("framework", sort=False).agg(
        final_reward=("final", "median"), final_min=("final", "min"), final_max=("final", "max"),
        seeds=("seed", "nunique"), reached=("time_s", "count"),
        time_s=("time_s", "median"), time_min=("time_s", "min"), time_max=("time_s", "max"),
        step=("step", "median"),
    ).reset_index()
    return table, target


OWN_AGREE = 0.01  # relative difference under which a framework's own throughput figure agrees with the harness's


def own_throughput_table(runs: list[Run], warmup: int) -> pd.DataFrame:
    """Per framework that logs a throughput figure of its own: that figure against the harness's tokens/s on the
    same measured steps of the same logs (medians over steps, then seeds), their ratio, and what the framework's
    figure counts (its adapter's own_throughput)."""
    rows = []
    for fw in dict.fromkeys(r.framework for r in runs):
        ok = [r for r in runs if r.framework == fw and r.status == "ok"
              and FRAMEWORK_THROUGHPUT in r.steps and r.steps[FRAMEWORK_THROUGHPUT].notna().any()]
        if not ok:
            continue
        measured = [r.steps[r.steps["step"] > warmup] for r in ok]
        ratio = pd.concat([m[FRAMEWORK_THROUGHPUT] / m["throughput_tok_s"] for m in measured])
        adapter = adapter_of(fw)
        rows.append({"framework": fw, "seeds": len(ok),
                     "own_tok_s": float(np.median([m[FRAMEWORK_THROUGHPUT].median() for m in measured])),
                     "harness_tok_s": float(np.median([m["throughput_tok_s"].median() for m in measured])),
                     "ratio_median": float(ratio.median()), "ratio_min": float(ratio.min()),
                     "ratio_max": float(ratio.max()),
                     "agree": bool((ratio - 1).abs().max() <= OWN_AGREE),
                     "definition": adapter.own_throughput if adapter is not None else ""})
    return pd.DataFrame(rows, columns=["framework", "seeds", "own_tok_s", "harness_tok_s", "ratio_median",
                                       "ratio_min", "ratio_max", "agree", "definition"])


# The rollout/trainer mismatch (#51; harness.results.metrics.MISMATCH).
MISMATCH_COLUMNS = ["framework", "seeds", "steps", "abs_diff_mean", "mult_prob_error_mean", "mult_prob_error_max",
                    "reason"]


def no_mismatch_reason(framework: str) -> str:
    """Why a framework's runs have no mismatch figures (harness.results.metrics says it per framework)."""
    adapter = adapter_of(framework)
    if adapter is not None and adapter.run is not None and adapter.plan is None:
        return ("embedded backend: it samples from a copy of the decoder it trains, given the same weights after "
                "every step, and keeps no log-probs of its samples")
    if adapter is not None and adapter.no_rollout_logprobs:
        return adapter.no_rollout_logprobs
    return "its runs logged no rollout log-probs (its adapter records none, and says nothing of why)"


def mismatch_table(runs: list[Run], frameworks: list[str], warmup: int) -> pd.DataFrame:
    """Per framework with a completed run: the rollout/trainer mismatch over its runs' measured steps (MISMATCH_NOTE),
    or why it has none."""
    rows = []
    for fw in dict.fromkeys([*frameworks, *(r.framework for r in runs)]):
        ok = [r for r in runs if r.framework == fw and r.status == "ok"]
        if not ok:
            continue
        measured = [m for r in ok if (m := r.steps[r.steps["step"] > warmup])["rollout_logprob_abs_diff_mean"]
                    .notna().any()]
        if not measured:
            rows.append({"framework": fw, "seeds": len(ok), "steps": 0, "abs_diff_mean": math.nan,
                         "mult_prob_error_mean": math.nan, "mult_prob_error_max": math.nan,
                         "reason": no_mismatch_reason(fw)})
            continue
        rows.append({"framework": fw, "seeds": len(measured),
                     "steps": int(sum(m["rollout_logprob_abs_diff_mean"].notna().sum() for m in measured)),
                     "abs_diff_mean": float(pd.Series([m["rollout_logprob_abs_diff_mean"].mean()
                                                       for m in measured]).median()),
                     "mult_prob_error_mean": float(pd.Series([m["rollout_token_mult_prob_error"].mean()
                                                              for m in measured]).median()),
                     "mult_prob_error_max": float(pd.concat([m["rollout_token_mult_prob_error"]
                                                             for m in measured]).max()),
                     "reason": ""})
    return pd.DataFrame(rows, columns=MISMATCH_COLUMNS)


def truth_table(runs: list[Run]) -> pd.DataFrame:
    """Per run with the task's exact-match accuracy logged: shared reward and accuracy, first and last 10% of
    steps, and how the two move together (Pearson over steps). Empty when no run logged the accuracy."""
    rows = []
    for r in runs:
        if r.status != "ok" or r.steps["task_accuracy_mean"].isna().all():
            continue
        reward_first, reward_last = edge_means(r.steps["reward_mean"])
        acc_first, acc_last = edge_means(r.steps["task_accuracy_mean"])
        rows.append({"framework": r.framework, "seed": r.seed, "reward_first10": reward_first,
                     "reward_last10": reward_last, "accuracy_first10": acc_first, "accuracy_last10": acc_last,
                     "correlation": r.steps["reward_mean"].corr(r.steps["task_accuracy_mean"])})
    return pd.DataFrame(rows)


def config_value(config: dict, dotted: str) -> Any:
    """The value at a dotted key (remax.lr), None where the config has none."""
    node = config
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def same_value(a: object, b: object) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=1e-12)
    return a == b


def fairness_table(config: dict, runs: list[Run]) -> pd.DataFrame:
    """One row per (shared key, framework): the effective value against the shared spec, and why it differs.

    The reference backend reads the shared config itself; a real framework's values come from its plans'
    `hyperparameters` and `deviations` (all seeds; differing values across seeds are all shown). Each plan entry
    is judged against its own `shared` value (the spec as the adapter applied it to that run, e.g. one seed of
    `seeds`); a scalar that differs from the config's means the plan was made from another config.
    """
    entries = [e for r in runs if r.plan for e in r.plan.get("hyperparameters", []) + r.plan.get("deviations", [])]
    keys = list(dict.fromkeys([f"remax.{k}" for k in config["remax"]] + [e["key"] for e in entries if e.get("key")]))
    spec = {k: config_value(config, k) if config_value(config, k) is not None else
            next((e.get("shared") for e in entries if e.get("key") == k), None) for k in keys}
    rows = []
    for fw in config["frameworks"]:
        adapter = adapter_of(fw)
        plans = [r.plan for r in runs if r.framework == fw and r.plan]
        for key in keys:
            row = dict(framework=fw, key=key, shared=spec[key], effective=None, framework_key="")
            if adapter is not None and adapter.run is not None and adapter.plan is None:
                rows.append({**row, "effective": spec[key], "framework_key": key, "state": "match",
                             "cause": "embedded backend: reads the shared config"})
                continue
            if not plans:
                rows.append({**row, "state": "unknown", "cause": "no plan.json under results/plans"})
                continue
            mapped = [h for p in plans for h in p.get("hyperparameters", []) if h.get("key") == key]
            devs = [d for p in plans for d in p.get("deviations", []) if d.get("key") == key]
            if not mapped and not devs:
                rows.append({**row, "state": "not mapped", "cause": "the adapter does not map this key"})
                continue
            causes = [d["cause"] for d in devs if d.get("cause")]
            # `means`: the framework's value in the shared spec's terms, where it spells the setting differently
            # (verl's ignore_eos False is generation_length natural; an absolute path names the same input).
            if any(not same_value(e.get("means", e.get("effective")), e.get("shared")) for e in mapped) \
                    and not causes:
                causes.append("differs from the shared spec; the adapter gives no cause")
            configured = config_value(config, key)
            stale = [e.get("shared") for e in mapped + devs if configured is not None and e.get("shared") is not None
                     and "means" not in e and not isinstance(configured, (list, dict))
                     # a deviation's "GPU plan: ..." describes a setting; only a value can be stale
                     and isinstance(e["shared"], str) == isinstance(configured, str)
                     and not same_value(e["shared"], configured)]
            if stale:
                causes.append(f"plan.json was made from another config (shared value there: {stale[0]})")
            effective = [json.loads(v) for v in dict.fromkeys(json.dumps(e.get("effective")) for e in mapped + devs)]
            rows.append({**row, "effective": effective[0] if len(effective) == 1 else effective,
                         "framework_key": ", ".join(dict.fromkeys(h.get("framework_key", "") for h in mapped)),
                         "state": "mismatch" if causes or devs else "match", "cause": "; ".join(dict.fromkeys(causes))})
    # object dtype: an integer setting stays an integer next to float ones
    return pd.DataFrame(rows, columns=["framework", "key", "shared", "effective", "framework_key", "state", "cause"],
                        dtype=object)


REWARD_COLUMNS = ["framework", "kind", "sha256", "checkpoint", "scored_by", "seeds"]


def reward_table(runs: list[Run]) -> pd.DataFrame:
    """Which shared reward scored each framework, and how: one row per (framework, reward, path) over its seeds.

    A real framework's plan.json says it ("reward": kind, checkpoint, sha256, scored_by); the embedded backend's
    manifest.json records the reward input it scored with in its own process (inputs.reward).
    """
    rows: dict[tuple, dict] = {}
    for r in runs:
        if r.plan and isinstance(r.plan.get("reward"), dict):
            rec = r.plan["reward"]
            kind, sha, ckpt, by = rec.get("kind"), rec.get("sha256"), rec.get("checkpoint"), rec.get("scored_by")
        elif r.manifest and isinstance((r.manifest.get("inputs") or {}).get("reward"), dict):
            rec = r.manifest["inputs"]["reward"]
            kind, sha, by = rec.get("kind"), rec.get("sha256"), "in-process"
            ckpt = rec.get("path") if kind == "model" else None
        else:
            continue
        row = rows.setdefault((r.framework, kind, sha, by), {"framework": r.framework, "kind": kind, "sha256": sha,
                                                              "checkpoint": ckpt, "scored_by": by, "seeds": []})
        row["seeds"].append(r.seed)
    return pd.DataFrame(list(rows.values()), columns=REWARD_COLUMNS, dtype=object)


CONFORMANCE_COLUMNS = ["framework", "case", "max_abs_diff", "verdict", "note", "source"]
SHARED_VECTORS = "shared vectors"  # `remax-bench conformance`: harness.conformance.CASES


def shared_vectors_source(env: str | None) -> str:
    """The source column of a `remax-bench conformance` row: the shared vectors, and the environment whose installed
    framework code computed them (on a CPU profile the runs' own)."""
    return f"{SHARED_VECTORS} in {env}" if env else SHARED_VECTORS


def read_conformance(results: Path, runs: list[Run], problems: list[str]) -> pd.DataFrame | None:
    """results/conformance.csv (the shared vectors, where the conformance target ran) and the rows each completed run
    of a framework that records its own advantages gives (Adapter.run_conformance); None when there are neither."""
    frames = []
    path = layout.path(results, layout.CONFORMANCE)
    if path.is_file():
        try:
            df = pd.read_csv(path)
            if "source" not in df.columns:  # written before the column existed: the shared vectors
                df["source"] = SHARED_VECTORS
            missing = [c for c in CONFORMANCE_COLUMNS if c not in df.columns]
            if missing:
                problems.append(f"{path}: lacks columns {', '.join(missing)}")
            else:
                frames.append(df[CONFORMANCE_COLUMNS])
        except (OSError, pd.errors.ParserError, pd.errors.EmptyDataError) as e:
            problems.append(f"{path}: unreadable ({e})")
    for run in runs:
        adapter = adapter_of(run.framework)
        check = adapter.run_conformance if adapter is not None and run.status == "ok" else None
        if check is None:
            continue
        try:
            df = check(layout.path(results, layout.RUN, framework=run.framework, seed=run.seed))
        except HarnessError as e:
            problems.append(str(e))
            continue
        if df is not None:
            frames.append(df[CONFORMANCE_COLUMNS])
    return pd.concat(frames, ignore_index=True) if frames else None


def read_parity(results: Path, problems: list[str]) -> pd.DataFrame | None:
    """results/parity/parity.csv (`remax-bench parity`, the pipeline's parity rule); None where it did not run."""
    from harness.parity.check import COLUMNS, TABLE

    path = layout.path(results, layout.PARITY) / TABLE
    if not path.is_file():
        return None
    try:
        df = pd.read_csv(path, keep_default_na=False, na_values=[""])
    except (OSError, pd.errors.ParserError, pd.errors.EmptyDataError) as e:
        problems.append(f"{path}: unreadable ({e})")
        return None
    missing = [c for c in COLUMNS if c not in df.columns]
    if missing:
        problems.append(f"{path}: lacks columns {', '.join(missing)}")
        return None
    return df[COLUMNS]


# Deviations whose cause is a proven reason for a framework's reward (docs/frameworks-on-cpu.md), said beside the
# reward verdict in the headline, not only in the fairness table.
REWARD_CAUSES = ("rollout.short_responses",)


def findings(table: pd.DataFrame, ttr: pd.DataFrame, runs: list[Run], fraction: float,
             on_cpu: bool = False) -> list[str]:
    """The page's answers in words, each computed from the tables below; on a CPU run the first says what its
    figures are (and are not)."""
    out = []
    if on_cpu:
        out.append("CPU run (no GPU in this profile): it proves each framework's path on this machine and compares "
                   "them here; it says nothing of GPU speed (each CPU difference from the GPU plan is in the "
                   "fairness table).")
    counts = pd.Series([r.status for r in runs]).value_counts()
    statuses = ("ok", "failed", "not run")
    out.append(f"{len(runs)} planned runs: " + ", ".join(f"{counts.get(s, 0)} {s}" for s in statuses))
    if table.empty:
        out.append("No run completed: nothing to compare.")
        return out
    fast, slow = table.iloc[-1], table.iloc[0]
    if len(table) == 1:
        out.append(f"Only {fast.framework} completed ({fmt(fast.tokens_per_s)} tokens/s): "
                   "no framework to compare with.")
    else:
        second = table.iloc[-2]
        real = ("its slowest seed is faster than the fastest seed of " + second.framework
                if fast.tokens_per_s_min > second.tokens_per_s_max else
                f"but its seed range overlaps that of {second.framework}: the difference may not be real")
        out.append(f"Fastest: {fast.framework}, {fmt(fast.tokens_per_s)} tokens/s, {fast.relative:.2f}x the slowest "
                   f"({slow.framework}); {real}.")
    for row in ttr.itertuples():
        if row.reached == 0:
            known = next((d for r in runs if r.framework == row.framework and r.plan
                          for d in r.plan.get("deviations", []) if d.get("key") in REWARD_CAUSES), None)
            out.append(f"{row.framework} did not reach {fraction:.0%} of the best final reward in any seed "
                       f"(final reward {fmt(row.final_reward, 3)})"
                       + (f"; known cause ({known['key']}): {known['cause']}" if known else "") + ".")
        else:
            out.append(f"{row.framework} reached {fraction:.0%} of the best final reward in {fmt(row.time_s, 1)} s "
                       f"(median over the {row.reached} of {row.seeds} seeds that reached it).")
    return out
