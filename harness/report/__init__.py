"""The report stage: from a results directory, a comparison of the frameworks (docs/report.md).

It writes into its output directory index.html (one self-contained page: stylesheet inlined, figures embedded),
throughput.md and throughput.csv (the shared comparison table), runs.csv (every planned run's status) and the
figures' PNGs. Every planned run (config frameworks x seeds) is listed as ok, failed or not run; a failed or
missing run never stops the report.

Modules: runs (what the results directory holds per run), tables (the data frames and throughput.md), claims
(published claims beside this run), figures (the PNGs), page (index.html from templates/report.html.j2,
templates/tables.html.j2 and templates/report.css).
"""

from __future__ import annotations

from pathlib import Path

from harness.frameworks.registry import on_cpu
from harness.io import atomic_path, write_text
from harness.report import figures, page
from harness.report.claims import claims_table, load_claims
from harness.report.repeats import reproducibility_view
from harness.report.runs import collect_runs, read_json, results_config, status_frame
from harness.report.tables import (
    eval_accuracy,
    fairness_table,
    findings,
    own_throughput_table,
    read_conformance,
    reward_table,
    run_table,
    step_time_table,
    throughput_markdown,
    throughput_table,
    time_to_reward_table,
    truth_table,
)
from harness.results import layout

CLAIMS_PATH = Path(__file__).resolve().parents[2] / "workflows" / "report" / "claims.yaml"


def render(results_dir: str | Path, out_dir: str | Path, claims_path: str | Path = CLAIMS_PATH,
           summary_path: str | Path | None = None) -> None:
    """Write index.html, throughput.md/.csv, runs.csv and the figures' PNGs into out_dir, from the results directory
    and the summarize stage's table (default: the results directory's summary.csv)."""
    results, out = Path(results_dir), Path(out_dir)
    config = results_config(results)
    claims = load_claims(Path(claims_path))
    problems: list[str] = []
    runs = collect_runs(results, config, problems, Path(summary_path) if summary_path else None)
    warmup = config["remax"]["warmup_steps"]
    fraction = config["report"]["time_to_reward_fraction"]
    per_run = run_table(runs, warmup)
    table = throughput_table(per_run)
    ttr, target = time_to_reward_table(runs, fraction)
    truth = truth_table(runs)
    out.mkdir(parents=True, exist_ok=True)
    pngs = figures.draw(out, list(config["frameworks"]), runs, per_run, table, ttr, target, truth=not truth.empty)
    write_text(out / "throughput.md", throughput_markdown(table))
    with atomic_path(out / "throughput.csv") as tmp:
        table.to_csv(tmp, index=False)
    with atomic_path(out / "runs.csv") as tmp:
        status_frame(runs).to_csv(tmp, index=False)
    cpu_run = on_cpu(config) or config["launch"]["gpus_per_node"] == 0
    data = page.PageData(
        config=config, results=results, runs=runs, findings=findings(table, ttr, runs, fraction, cpu_run),
        throughput=table,
        own_throughput=own_throughput_table(runs, warmup), step_time=step_time_table(per_run),
        time_to_reward=ttr, target=target, eval_accuracy=eval_accuracy(per_run), truth=truth,
        reward_record=read_json(layout.path(results, layout.REWARD_RECORD), problems) if not truth.empty else None,
        fairness=fairness_table(config, runs), reward=reward_table(runs),
        conformance=read_conformance(results, runs, problems), claims=claims_table(claims, runs, table, config),
        problems=problems, reproducibility=reproducibility_view(results, config, runs, problems))
    write_text(out / "index.html", page.html(data, pngs))
