"""Subcommands of the nightly check: the history, its baselines, and the check of the latest run against them."""

from __future__ import annotations

import argparse
import shlex
import sys

from harness import HarnessError
from harness.cli.args import MAX_BASELINE_RUNS, at_least, nonempty
from harness.results import layout


def cmd_history_append(args: argparse.Namespace) -> None:
    from harness.io import check_replaceable, write_json
    from harness.regression.history import RECEIPT_ROLE, append

    if args.receipt:  # a receipt it cannot write is refused before the history grows
        check_replaceable(args.receipt, role=RECEIPT_ROLE)
    path, rows, new = append(args.results)
    print(f"{path}: {'appended' if new else 'already in the history, nothing written:'} {len(rows)} run(s) of "
          f"pipeline run {rows[0]['pipeline_run']}")
    if args.receipt:
        write_json(args.receipt, {"history_file": str(path), "pipeline_run": rows[0]["pipeline_run"],
                                  "runs": [r["run_id"] for r in rows], "newly_appended": new}, role=RECEIPT_ROLE)


def cmd_history_page(args: argparse.Namespace) -> None:
    from harness.report.history import write_history_page

    out = write_history_page(args.results, args.out, args.baseline)
    print(f"{out}: the history of {args.results}")


def _history(sub: argparse._SubParsersAction) -> None:
    sp = sub.add_parser("history", help="the append-only results history (RESULTS/history)")
    hsub = sp.add_subparsers(dest="action", required=True)
    hp = hsub.add_parser("append", help="add the pipeline run in RESULTS to the history (once; idempotent)")
    hp.add_argument("--results", type=nonempty, default="results")
    hp.add_argument("--receipt", type=nonempty,
                    help="also write a small JSON receipt here (the pipeline rule's output)")
    hp.set_defaults(func=cmd_history_append)
    pp = hsub.add_parser("page", help="OUT/history.html: every night per framework and metric, alerts marked")
    pp.add_argument("results", type=nonempty, nargs="?", default="results", help="results directory holding history/ "
                    "(default: %(default)s)")
    pp.add_argument("--out", type=nonempty, required=True, help="folder for history.html (e.g. results/report)")
    pp.add_argument("--baseline", type=nonempty,
                    help="the baseline whose band to draw (default: the one the latest check used)")
    pp.set_defaults(func=cmd_history_page)


def cmd_baseline_update(args: argparse.Namespace) -> None:
    from harness.io import read_json_object, write_json
    from harness.regression.baseline import BASELINE_ROLE, build_baseline

    profile = args.profile
    if profile is None:
        config = layout.path(args.results, layout.CONFIG)
        profile = read_json_object(config, "effective config", "; give the profile with --profile").get("profile")
        if not isinstance(profile, str):
            raise HarnessError(f"{config}: profile: expected a string, not {profile!r:.40}; give it with --profile")
    command = "remax-bench " + shlex.join(sys.argv[1:])
    base = build_baseline(layout.path(args.results, layout.HISTORY), profile=profile, runs=args.runs, last=args.last,
                          command=command)
    write_json(args.out, base, role=BASELINE_ROLE)
    print(f"{args.out}: baseline of profile {profile!r} from pipeline runs "
          + ", ".join(p["pipeline_run"] for p in base["pipeline_runs"]))


def _baseline(sub: argparse._SubParsersAction) -> None:
    sp = sub.add_parser("baseline", help="write baselines/<profile>.json from chosen history rows")
    bsub = sp.add_subparsers(dest="action", required=True)
    bp = bsub.add_parser("update", help="a new baseline from the last N pipeline runs, or the ones named")
    bp.add_argument("--results", type=nonempty, default="results",
                    help="results directory holding history/ (default: %(default)s)")
    bp.add_argument("--out", type=nonempty, required=True, help="baseline file, e.g. baselines/cpu.json")
    bp.add_argument("--profile", type=nonempty, help="default: the profile of RESULTS/config.json")
    bp.add_argument("--runs", type=nonempty, nargs="+", metavar="ID",
                    help="pipeline run ids (or unique prefixes) to use")
    bp.add_argument("--last", type=at_least(1, MAX_BASELINE_RUNS), default=5,
                    help=f"else the last N pipeline runs, at most {MAX_BASELINE_RUNS} (default: %(default)s)")
    bp.set_defaults(func=cmd_baseline_update)


def cmd_check(args: argparse.Namespace) -> int:
    from harness.regression.alerts import render_markdown, write_alerts
    from harness.regression.check import check
    from harness.regression.ci import write_ci_outputs

    result = check(args.baseline, args.results)
    write_alerts(result, args.results)
    write_ci_outputs(result, args.summary_md, args.junit, str(layout.path(args.results, layout.ALERTS)))
    print(render_markdown(result))
    return 1 if result["status"] == "regression" else 0


def _check(sub: argparse._SubParsersAction) -> None:
    sp = sub.add_parser("check", help="regression check of the latest run: exit 0 ok, 1 regression, 2 bad input")
    sp.add_argument("--baseline", type=nonempty, required=True, help="baselines/<profile>.json")
    sp.add_argument("--results", type=nonempty, required=True, help="results directory (summary, runs, history)")
    sp.add_argument("--summary-md", type=nonempty,
                    help="also write the verdict as GitHub-flavoured Markdown here (a job summary or "
                         "a pull-request comment); appended to $GITHUB_STEP_SUMMARY whenever that is set")
    sp.add_argument("--junit", type=nonempty,
                    help="also write the verdict as JUnit XML here: a test case per framework and metric, "
                         "a regression a failure")
    sp.set_defaults(func=cmd_check)


COMMANDS = (_history, _baseline, _check)
