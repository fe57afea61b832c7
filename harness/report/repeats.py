"""The report's Reproducibility section (docs/reproducibility.md): each repeat's verdict against its original
(results/repeats/*/*/reproduce.json), and per framework the spread between repeats of one seed beside the spread
between seeds, so a reader sees whether a difference between frameworks is larger than a framework's own noise."""

from __future__ import annotations

import math
from pathlib import Path

from harness import HarnessError
from harness.frameworks import get_adapter
from harness.report.runs import Run, read_record
from harness.report.tables import fmt
from harness.results import layout
from harness.results.metrics import read_metrics
from harness.results.records import OBJECT, TEXT
from harness.results.reproducibility import greedy_responses, run_figures, spread_rows, step0_agreement
from harness.runs.reproduce import RECORD
from harness.runs.train import METRICS

DIGITS = {"curve": 3, "final_reward": 3, "eval_accuracy": 3, "tokens_per_s": 0}


def reproducibility_view(results: Path, config: dict, runs: list[Run], problems: list[str]) -> dict:
    """{"determinism", "verdicts", "spreads", "agreement"}: verdicts and spreads are empty when the profile repeats
    no seed."""
    rc = config["reproducibility"]
    view = {"determinism": rc["determinism"], "verdicts": [], "spreads": [],
            "agreement": step0_view(results, runs, problems)}
    if not rc["repeat_seeds"]:
        return view
    warmup = config["remax"]["warmup_steps"]
    verdicts, spreads = [], []
    for fw in config["frameworks"]:
        done = {r.seed: r for r in runs if r.framework == fw and r.metrics is not None}
        originals = {seed: run_figures(r.steps, layout.path(results, layout.RUN, framework=fw, seed=seed)
                                       / "eval.json", warmup) for seed, r in done.items()}
        repeats: dict[int, list[dict]] = {}
        for seed in rc["repeat_seeds"]:
            for k in range(2, rc["repeats"] + 1):
                repeat_dir = layout.path(results, layout.REPEAT, framework=fw, seed=seed, repeat=k)
                record = read_record(repeat_dir / RECORD, problems, {"verdict": TEXT, "text": TEXT}, "reproduce record",
                                     ("verdict", "text"))
                verdicts.append({"framework": fw, "seed": seed, "repeat": k,
                                 "verdict": record["verdict"] if record else "not run",
                                 "text": record["text"] if record else
                                 f"no {RECORD} (see {layout.REPEAT_LOG.format(framework=fw, seed=seed, repeat=k)})"})
                if record:  # reproduce trains through runs.train, which keeps the repeat's steps in its METRICS
                    repeats.setdefault(seed, []).append(run_figures(read_metrics(repeat_dir / METRICS),
                                                                    repeat_dir / "eval.json", warmup))
        if repeats and originals:
            spreads += [{"framework": fw, "figure": row["figure"],
                         "between_repeats": fmt(row["between_repeats"], DIGITS[key]),
                         "between_seeds": fmt(row["between_seeds"], DIGITS[key]),
                         "cls": "mismatch" if _larger(row) else ""}
                        for key, row in zip(DIGITS, spread_rows(originals, repeats))]
    return {**view, "verdicts": verdicts, "spreads": spreads}


def step0_view(results: Path, runs: list[Run], problems: list[str]) -> list[dict]:
    """Per completed run of a real framework: how many eval prompts it answers, before training, with the embedded
    reference backend's greedy response (same seed's reference run, else the first one); empty without a reference
    run that kept its responses."""
    def responses(run: Run) -> dict[str, str] | None:
        path = layout.path(results, layout.RUN, framework=run.framework, seed=run.seed) / "eval.json"
        record = read_record(path, problems, {"before": OBJECT}, "eval record") if run.status == "ok" else None
        try:
            return greedy_responses(record, path) if record else None
        except HarnessError as e:
            problems.append(str(e))
            return None

    kept = {(r.framework, r.seed): responses(r) for r in runs}
    status = {(r.framework, r.seed): r.status for r in runs}
    references = {seed: got for (fw, seed), got in kept.items() if got is not None and get_adapter(fw).run}
    if not references:
        return []
    rows = []
    for (fw, seed), got in kept.items():
        # a run that did not finish has no row: its evaluation says nothing (the run table says why it did not run)
        if get_adapter(fw).run or status[(fw, seed)] != "ok":
            continue
        if got is None:
            rows.append({"framework": fw, "seed": seed, "agree": "", "cls": "notrun",
                         "text": "its evaluation keeps no greedy responses"})
            continue
        a = step0_agreement(references.get(seed) or next(iter(references.values())), got)
        first = a["first"]
        rows.append({"framework": fw, "seed": seed, "agree": f"{a['agree']} of {a['n']}",
                     "cls": "ok" if a["agree"] == a["n"] else "mismatch",
                     "text": "; ".join(filter(None, [
                         f"{a['missing']} prompts not in its evaluation" if a["missing"] else "",
                         f"first difference: {first['prompt']!r} -> reference {first['reference']!r}, "
                         f"{fw} {first['framework']!r}" if first else ""]))})
    return rows


def _larger(row: dict) -> bool:
    """Run-to-run noise of one seed at least as large as seed noise: a difference between frameworks needs both."""
    a, b = row["between_repeats"], row["between_seeds"]
    return not (math.isnan(a) or math.isnan(b)) and a >= b > 0
