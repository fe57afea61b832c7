"""Subcommands that say whether performance changed: the history and its baselines, the nightly check, a rerun from a
manifest, the paired A/B of two arms and the bisect built on it."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from harness import HarnessError
from harness.cli.args import at_least, fraction, json_object, positive, seed_list
from harness.results import layout


def cmd_history_append(args: argparse.Namespace) -> None:
    from harness.io import check_replaceable, write_json
    from harness.regression.history import append

    if args.receipt:  # a receipt it cannot write is refused before the history grows
        check_replaceable(args.receipt)
    path, rows, new = append(args.results)
    print(f"{path}: {'appended' if new else 'already in the history, nothing written:'} {len(rows)} run(s) of "
          f"pipeline run {rows[0]['pipeline_run']}")
    if args.receipt:
        write_json(args.receipt, {"history_file": str(path), "pipeline_run": rows[0]["pipeline_run"],
                                  "runs": [r["run_id"] for r in rows], "newly_appended": new})


def _history(sub: argparse._SubParsersAction) -> None:
    sp = sub.add_parser("history", help="the append-only results history (RESULTS/history)")
    hsub = sp.add_subparsers(dest="action", required=True)
    hp = hsub.add_parser("append", help="add the pipeline run in RESULTS to the history (once; idempotent)")
    hp.add_argument("--results", default="results")
    hp.add_argument("--receipt", help="also write a small JSON receipt here (the pipeline rule's output)")
    hp.set_defaults(func=cmd_history_append)


def cmd_baseline_update(args: argparse.Namespace) -> None:
    from harness.io import read_json_object, write_json
    from harness.regression.baseline import build_baseline

    profile = args.profile
    if profile is None:
        config = layout.path(args.results, layout.CONFIG)
        profile = read_json_object(config, "effective config", "; give the profile with --profile").get("profile")
        if not isinstance(profile, str):
            raise HarnessError(f"{config}: profile: expected a string, not {profile!r:.40}; give it with --profile")
    command = "remax-bench " + shlex.join(sys.argv[1:])
    base = build_baseline(layout.path(args.results, layout.HISTORY), profile=profile, runs=args.runs, last=args.last,
                          command=command)
    write_json(args.out, base)
    print(f"{args.out}: baseline of profile {profile!r} from pipeline runs "
          + ", ".join(p["pipeline_run"] for p in base["pipeline_runs"]))


def _baseline(sub: argparse._SubParsersAction) -> None:
    sp = sub.add_parser("baseline", help="write baselines/<profile>.json from chosen history rows")
    bsub = sp.add_subparsers(dest="action", required=True)
    bp = bsub.add_parser("update", help="a new baseline from the last N pipeline runs, or the ones named")
    bp.add_argument("--results", default="results", help="results directory holding history/ (default: %(default)s)")
    bp.add_argument("--out", required=True, help="baseline file, e.g. baselines/cpu.json")
    bp.add_argument("--profile", help="default: the profile of RESULTS/config.json")
    bp.add_argument("--runs", nargs="+", metavar="ID", help="pipeline run ids (or unique prefixes) to use")
    bp.add_argument("--last", type=at_least(1), default=5,
                    help="else the last N pipeline runs (default: %(default)s)")
    bp.set_defaults(func=cmd_baseline_update)


def cmd_check(args: argparse.Namespace) -> int:
    from harness.regression.alerts import render_markdown, write_alerts
    from harness.regression.check import check

    result = check(args.baseline, args.results)
    write_alerts(result, args.results)
    print(render_markdown(result))
    return 1 if result["status"] == "regression" else 0


def _check(sub: argparse._SubParsersAction) -> None:
    sp = sub.add_parser("check", help="regression check of the latest run: exit 0 ok, 1 regression, 2 bad input")
    sp.add_argument("--baseline", required=True, help="baselines/<profile>.json")
    sp.add_argument("--results", required=True, help="results directory (summary, runs, history)")
    sp.set_defaults(func=cmd_check)


def cmd_reproduce(args: argparse.Namespace) -> None:
    from harness.regression.reproduce import RECORD, reproduce

    record = reproduce(args.run_dir, args.out, args.inputs, args.timeout_min)
    print(f"{record['run_id']}: {record['text']} ({args.out}/{RECORD})")


def _reproduce(sub: argparse._SubParsersAction) -> None:
    sp = sub.add_parser("reproduce", help="run a finished run again from its manifest and say whether it reproduced "
                                          "(identical, or the first divergent step); exit 2 naming what differs "
                                          "when inputs, commit, packages or machine are not the recorded ones")
    sp.add_argument("run_dir")
    sp.add_argument("--out", required=True, help="the rerun's run directory (never the original)")
    sp.add_argument("--inputs", help="the inputs directory (default: where the manifest's dataset is)")
    sp.add_argument("--timeout-min", type=positive, help="a planned framework's timeout (default: the config's)")
    sp.set_defaults(func=cmd_reproduce)


def _ab_limits(args: argparse.Namespace) -> dict:
    return {"framework": args.framework, "seeds": args.seeds, "max_pairs": args.max_pairs, "min_pairs": args.min_pairs,
            "max_minutes": args.max_minutes, "resolution": args.resolution, "alpha": args.alpha}


def _ab_options(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--config", required=True, help="the profile both arms run (YAML)")
    sp.add_argument("--framework", help="the framework both arms run (default: the config's one framework)")
    sp.add_argument("--out", required=True)
    sp.add_argument("--seeds", type=seed_list, help="seeds, comma-separated (default: the config's)")
    sp.add_argument("--max-pairs", type=at_least(2), default=30, help="hard cap on pairs (default: %(default)s)")
    sp.add_argument("--min-pairs", type=at_least(2), default=3,
                    help="pairs before the first look (default: %(default)s)")
    sp.add_argument("--max-minutes", type=positive, default=15.0, help="hard cap on time (default: %(default)s)")
    sp.add_argument("--resolution", type=fraction, default=0.03,
                    help="'no difference' needs the interval within this fraction (default: %(default)s)")
    sp.add_argument("--alpha", type=fraction, default=0.01,
                    help="chance that A against A is called different, over all looks (default: %(default)s)")


def _repo() -> Path:
    from harness.regression.ab import git

    return Path(git(Path.cwd(), "rev-parse", "--show-toplevel"))


def _env_args(given: list[str] | None, label: str) -> dict[str, Path]:
    out = {}
    for text in given or []:
        name, sep, spec = text.partition("=")
        if not sep or not name or not spec:
            raise HarnessError(f"--{label.lower()}-env {text!r}: expected NAME=DESCRIPTION_FILE "
                               "(e.g. verl-cpu=envs/verl-0.9.2.txt)")
        out[name] = Path(spec)
    return out


def cmd_ab(args: argparse.Namespace) -> int:
    from harness.regression.ab import EXIT, Arm, compare
    from harness.report.ab import PAGE, write_page

    arms = [Arm(label, spec, json_object(override, f"--{label.lower()}-set"), envs=_env_args(given, label))
            for label, spec, override, given in (("A", args.a, args.a_set, args.a_env),
                                                 ("B", args.b, args.b_set, args.b_env))]
    record = compare(_repo(), Path(args.config), arms[0], arms[1], Path(args.out), split=args.split,
                     render=write_page, **_ab_limits(args))
    print(f"{record['verdict']['text']} ({args.out}/{PAGE})")
    return EXIT[record["verdict"]["verdict"]]


def _ab(sub: argparse._SubParsersAction) -> None:
    sp = sub.add_parser("ab", help="is B slower than A? Two commits, framework versions or configs run "
                                   "interleaved, paired; exit 0 no slower, 1 slower, 4 inconclusive, 2 bad arm")
    sp.add_argument("--a", required=True, help="arm A: a git ref, or a clean checkout's path")
    sp.add_argument("--b", required=True, help="arm B: a git ref, or a clean checkout's path")
    sp.add_argument("--a-set", help="arm A's config override, a JSON object")
    sp.add_argument("--b-set", help="arm B's config override, a JSON object")
    for arm in ("a", "b"):
        sp.add_argument(f"--{arm}-env", action="append", metavar="NAME=FILE",
                        help=f"arm {arm.upper()}'s framework environment NAME from this description (a pip "
                             "requirements file as a framework's envs/NAME.txt: another framework version); repeatable")
    sp.add_argument("--split", type=fraction, help="decide only whether B is slower than A by more than this fraction "
                                                "(what bisect asks of each commit)")
    _ab_options(sp)
    sp.set_defaults(func=cmd_ab)


def cmd_bisect(args: argparse.Namespace) -> None:
    from harness.regression.bisect import bisect

    ab_args = [f"--{k.replace('_', '-')}={v}" for k, v in _ab_limits(args).items() if k != "seeds" and v is not None]
    ab_args += [f"--seeds={','.join(map(str, args.seeds))}"] if args.seeds else []
    bisect(_repo(), args.good, args.bad, Path(args.config), Path(args.out), ab_args,
           confirmed_by=Path(args.confirmed_by) if args.confirmed_by else None, framework=args.framework)


def _bisect(sub: argparse._SubParsersAction) -> None:
    sp = sub.add_parser("bisect", help="the first commit between GOOD and BAD that `ab` against GOOD calls slower "
                                       "(git bisect run)")
    sp.add_argument("good")
    sp.add_argument("bad")
    sp.add_argument("--confirmed-by", metavar="AB_DIR", help="an `ab` of GOOD against BAD under this config that "
                                                            "called BAD slower: its round 0, not run again")
    _ab_options(sp)
    sp.set_defaults(func=cmd_bisect)


COMMANDS = (_history, _baseline, _check, _reproduce, _ab, _bisect)
