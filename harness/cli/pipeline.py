"""Subcommands of the data flow around the runs (harness.cli.runs): config and inputs before them; summarize,
conformance, update parity and the report after them."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from harness import HarnessError
from harness.cli.args import config, nonempty, with_config, with_inputs


def cmd_freeze_config(args: argparse.Namespace) -> None:
    from harness.config import CONFIG_ROLE, validate_config
    from harness.io import parse_document, write_json

    write_json(args.out, validate_config(parse_document(args.json, "--json", yaml_syntax=False),
                                         source="snakemake config"), role=CONFIG_ROLE)


def _freeze_config(sub: argparse._SubParsersAction) -> None:
    sp = sub.add_parser("freeze-config", help="validate a config given as JSON, fill defaults, write it")
    sp.add_argument("--json", type=nonempty, required=True)
    sp.add_argument("--out", type=nonempty, required=True)
    sp.set_defaults(func=cmd_freeze_config)


def cmd_inputs(args: argparse.Namespace) -> None:
    from harness import inputs

    build = {"dataset": inputs.build_dataset, "policy": inputs.build_policy, "reward": inputs.build_reward}[args.what]
    print(f"{args.what}: sha256 {build(config(args), args.inputs)}")


def _inputs(sub: argparse._SubParsersAction) -> None:
    sp = sub.add_parser("inputs", help="build one shared input (with its .sha256)")
    sp.add_argument("what", choices=["dataset", "policy", "reward"])
    with_config(sp)
    with_inputs(sp)
    sp.set_defaults(func=cmd_inputs)


def cmd_summarize(args: argparse.Namespace) -> None:
    from harness.io import atomic_path
    from harness.results.summarize import SUMMARY_ROLE, efficiency_of, summarize

    cfg = config(args)
    evals = [Path(d) / "eval.json" for d in args.runs if (Path(d) / "eval.json").is_file()]
    efficiency = efficiency_of(cfg, Path(args.policy), [Path(d) for d in args.runs]) if args.policy else None
    summary = summarize([Path(p) for p in args.metrics], evals, cfg["remax"]["warmup_steps"], efficiency,
                        partial=args.partial)
    with atomic_path(args.out, role=SUMMARY_ROLE) as tmp:
        summary.to_csv(tmp, index=False)
    print(summary.to_string(index=False))


def _summarize(sub: argparse._SubParsersAction) -> None:
    sp = sub.add_parser("summarize", help="per-run summaries (after warm-up) -> CSV")
    with_config(sp)
    sp.add_argument("--metrics", type=nonempty, nargs="+", required=True, help="common-schema parquet files")
    sp.add_argument("--runs", type=nonempty, nargs="*", default=[],
                    help="run directories; the eval.json of those that have one (greedy accuracy) is joined by run_id")
    sp.add_argument("--policy", type=nonempty,
                    help="the shared policy checkpoint: its config.json gives the model FLOPs of the MFU columns "
                         "(against each run directory's peak)")
    sp.add_argument("--partial", action="store_true",
                    help="leave out (and name) a run that cannot be summarized, instead of failing; for the report "
                         "of a failed pipeline run, which marks such a run failed")
    sp.add_argument("--out", type=nonempty, required=True)
    sp.set_defaults(func=cmd_summarize)


def cmd_conformance(args: argparse.Namespace) -> None:
    """Each configured framework's own advantage code on the shared vectors, in one table for the report."""
    import pandas as pd

    from harness.conformance import TABLE_ROLE
    from harness.frameworks import conformance_env, get_adapter
    from harness.io import atomic_path
    from harness.report.tables import shared_vectors_source

    cfg = config(args)
    adapters = [a for fw in cfg["frameworks"] if (a := get_adapter(fw)).conformance is not None]
    tables = [a.conformance(cfg).assign(source=shared_vectors_source(conformance_env(a, cfg)))  # type: ignore[misc]
              for a in adapters]
    if not tables:
        raise HarnessError(f"{args.config}: no configured framework has a conformance check")
    table = pd.concat(tables, ignore_index=True)
    with atomic_path(args.out, role=TABLE_ROLE) as tmp:
        table.to_csv(tmp, index=False)
    print(table.to_string(index=False))


def _conformance(sub: argparse._SubParsersAction) -> None:
    sp = sub.add_parser("conformance", help="frameworks' own ReMax advantage vs the reference (builds their CPU envs)")
    with_config(sp)
    sp.add_argument("--out", type=nonempty, required=True)
    sp.set_defaults(func=cmd_conformance)


def cmd_parity(args: argparse.Namespace) -> int:
    """Each framework's own update on one fixed batch against the reference's (harness/parity.py). Exit 1 where a
    framework's driver failed (its row says why); a difference is a finding, not a failure: exit 0."""
    from harness.parity.check import TABLE, check
    from harness.parity.compare import summary

    rows = check(config(args), args.inputs, args.out, args.frameworks)
    failed = [r["framework"] for r in rows if r["verdict"] == "failed"]
    for fw in dict.fromkeys(r["framework"] for r in rows):
        print(f"{fw}: {summary([r for r in rows if r['framework'] == fw])}")
    if failed:
        print(f"parity: the driver of {', '.join(failed)} failed (its row in {args.out}/{TABLE} says why)",
              file=sys.stderr)
    return 1 if failed else 0


def _parity(sub: argparse._SubParsersAction) -> None:
    sp = sub.add_parser("parity", help="do the frameworks perform the same ReMax update? each one's own training code "
                                       "on one fixed batch against the reference (builds their environments)")
    with_config(sp)
    with_inputs(sp)
    sp.add_argument("--frameworks", type=nonempty, nargs="+",
                    help="these frameworks only (default: every configured one with a parity driver)")
    sp.add_argument("--out", type=nonempty, required=True, help="a folder: the batch, each update, parity.csv")
    sp.set_defaults(func=cmd_parity)


def cmd_report(args: argparse.Namespace) -> None:
    from harness.report import render

    render(args.results_dir, args.out, summary_path=args.summary)


def _report(sub: argparse._SubParsersAction) -> None:
    sp = sub.add_parser("report", help="comparison report (index.html, throughput.md/.csv, figures, runs.csv) "
                                       "from a results directory; every planned run listed, failed ones too")
    sp.add_argument("results_dir", type=nonempty)
    sp.add_argument("--out", type=nonempty, required=True)
    sp.add_argument("--summary", type=nonempty, help="the summarize stage's table (default: RESULTS_DIR/summary.csv)")
    sp.set_defaults(func=cmd_report)


COMMANDS = (_freeze_config, _inputs, _summarize, _conformance, _parity, _report)
