"""The report stage: from a results directory, a comparison of the frameworks (docs/report.md).

It writes into its output directory index.html (one self-contained page: stylesheet inlined, figures embedded),
history.html where the results directory has a nightly history (harness/report/history.py, linked from index.html),
throughput.md and throughput.csv (the shared comparison table), runs.csv (every planned run's status) and the
figures' PNGs. The directory is written whole (harness.io.atomic_path, owner layout.report_owner): an interrupted or
failed report leaves the previous one as it was, and the output never replaces a folder that is not a report (a
results directory, a run). Every planned run (config frameworks x seeds) is listed as ok, failed or not run; a failed
or missing run never stops the report.

Modules: runs (what the results directory holds per run), tables (the data frames and throughput.md), claims
(published claims beside this run), figures (the PNGs), page (index.html from templates/report.html.j2,
templates/tables.html.j2 and templates/report.css).
"""

from __future__ import annotations

from pathlib import Path

from harness.frameworks.registry import on_cpu
from harness.io import atomic_path
from harness.report import figures, page
from harness.report.claims import claims_table, load_claims
from harness.report.repeats import reproducibility_view
from harness.report.runs import collect_runs, read_record, results_config, status_frame
from harness.report.tables import (
    eval_accuracy,
    fairness_table,
    findings,
    own_throughput_table,
    read_conformance,
    read_parity,
    reward_table,
    run_table,
    step_time_table,
    throughput_markdown,
    throughput_table,
    time_to_reward_table,
    truth_table,
)
from harness.results import layout
from harness.results.records import INTEGER, NUMBER, OBJECT, or_null

CLAIMS_PATH = Path(__file__).resolve().parents[2] / "workflows" / "report" / "claims.yaml"
# What the page shows of inputs/reward/reward.json: how well a trained reward model ranks held-out pairs.
REWARD_RECORD = {"pair_accuracy_eval": or_null(NUMBER), "eval_pairs": or_null(INTEGER),
                 "pair_accuracy_eval_by_mistake": OBJECT, "pair_accuracy_eval_by_mistake.*": NUMBER}


def render(results_dir: str | Path, out_dir: str | Path, claims_path: str | Path = CLAIMS_PATH,
           summary_path: str | Path | None = None) -> None:
    """Write index.html, throughput.md/.csv, runs.csv and the figures' PNGs into out_dir, from the results directory
    and the summarize stage's table (default: the results directory's summary.csv). out_dir is written whole or not
    at all, and replaces only an earlier report: a failed render leaves the previous report as it was."""
    results = Path(results_dir)
    with atomic_path(out_dir, owner=layout.report_owner()) as out:
        out.mkdir()
        _write(results, out, Path(claims_path), Path(summary_path) if summary_path else None)


def _history_page(results: Path, out: Path, problems: list[str]) -> str | None:
    """history.html beside index.html where the results directory has a history (its own page: a year of nights
    per framework and metric would bury the run's comparison); None without one. A history it cannot read is one
    of the page's problems, never a failed report."""
    from harness import HarnessError
    from harness.report.history import history_html

    if not any(layout.path(results, layout.HISTORY).glob("*.jsonl")):
        return None
    try:
        (out / "history.html").write_text(history_html(results, out))
    except HarnessError as e:
        problems.append(f"the nightly history: {e}")
        return None
    return "history.html"


def _write(results: Path, out: Path, claims_path: Path, summary_path: Path | None) -> None:
    config = results_config(results)
    claims = load_claims(claims_path)
    problems: list[str] = []
    runs = collect_runs(results, config, problems, summary_path)
    warmup = config["remax"]["warmup_steps"]
    fraction = config["report"]["time_to_reward_fraction"]
    per_run = run_table(runs, warmup)
    table = throughput_table(per_run)
    ttr, target = time_to_reward_table(runs, fraction)
    truth = truth_table(runs)
    pngs = figures.draw(out, list(config["frameworks"]), runs, per_run, table, ttr, target, truth=not truth.empty)
    (out / "throughput.md").write_text(throughput_markdown(table))
    table.to_csv(out / "throughput.csv", index=False)
    status_frame(runs).to_csv(out / "runs.csv", index=False)
    cpu_run = on_cpu(config) or config["launch"]["gpus_per_node"] == 0
    data = page.PageData(
        config=config, results=results, runs=runs, findings=findings(table, ttr, runs, fraction, cpu_run),
        throughput=table,
        own_throughput=own_throughput_table(runs, warmup), step_time=step_time_table(per_run),
        time_to_reward=ttr, target=target, eval_accuracy=eval_accuracy(per_run), truth=truth,
        reward_record=read_record(layout.path(results, layout.REWARD_RECORD), problems, REWARD_RECORD,
                                  "reward record") if not truth.empty else None,
        fairness=fairness_table(config, runs), reward=reward_table(runs),
        conformance=read_conformance(results, runs, problems), parity=read_parity(results, problems),
        claims=claims_table(claims, runs, table, config),
        problems=problems, reproducibility=reproducibility_view(results, config, runs, problems),
        history=_history_page(results, out, problems))
    (out / "index.html").write_text(page.html(data, pngs))
