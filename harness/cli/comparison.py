"""Subcommands of the paired comparison: the A/B of two arms (commits, framework versions or configs), and the
bisect built on it."""

from __future__ import annotations

import argparse
from pathlib import Path

from harness import HarnessError
from harness.cli.args import MAX_PAIRS, at_least, fraction, git_ref, json_object, minutes, nonempty, seed_list


def _ab_limits(args: argparse.Namespace) -> dict:
    return {"framework": args.framework, "seeds": args.seeds, "max_pairs": args.max_pairs, "min_pairs": args.min_pairs,
            "max_minutes": args.max_minutes, "resolution": args.resolution, "alpha": args.alpha,
            "together": not args.one_at_a_time, "as_configured": args.as_configured}


def _ab_options(sp: argparse.ArgumentParser, budget: str = "--max-minutes") -> None:
    sp.add_argument("--config", type=nonempty, required=True, help="the profile both arms run (YAML)")
    sp.add_argument("--framework", type=nonempty,
                    help="the framework both arms run (default: the config's one framework)")
    sp.add_argument("--out", type=nonempty, required=True)
    sp.add_argument("--seeds", type=seed_list, help="seeds, comma-separated (default: the config's)")
    sp.add_argument("--max-pairs", type=at_least(2, MAX_PAIRS), default=100,
                    help=f"hard cap on pairs, at most {MAX_PAIRS} (default: %(default)s)")
    sp.add_argument("--min-pairs", type=at_least(2, MAX_PAIRS), default=3,
                    help="pairs before the first look, at most --max-pairs (default: %(default)s)")
    sp.add_argument(budget, dest="max_minutes", type=minutes, default=15.0,
                    help="hard cap on the A/B's time, in minutes (default: %(default)s)")
    sp.add_argument("--resolution", type=fraction, default=0.02,
                    help="'no difference' needs the interval within this fraction (default: %(default)s)")
    sp.add_argument("--alpha", type=fraction, default=0.01,
                    help="chance that A against A is called different, over all looks (default: %(default)s)")
    sp.add_argument("--one-at-a-time", action="store_true",
                    help="run a pair's two runs one after the other even where they could run side by side, each "
                         "on its own cores (on a CPU with room for both)")
    sp.add_argument("--as-configured", action="store_true",
                    help="train the config's steps, not the framework's A/B profile (its adapter's ab_profile: few "
                         "steps after warm-up, for a framework whose start-up and steps take minutes)")


def _repo() -> Path:
    from harness.runtime.git import git

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
    from harness.comparison.ab import EXIT, Arm, compare
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
    sp.add_argument("--a", type=git_ref, required=True, help="arm A: a git ref, or a clean checkout's path")
    sp.add_argument("--b", type=git_ref, required=True, help="arm B: a git ref, or a clean checkout's path")
    sp.add_argument("--a-set", type=nonempty, help="arm A's config override, a JSON object")
    sp.add_argument("--b-set", type=nonempty, help="arm B's config override, a JSON object")
    for arm in ("a", "b"):
        sp.add_argument(f"--{arm}-env", type=nonempty, action="append", metavar="NAME=FILE",
                        help=f"arm {arm.upper()}'s framework environment NAME from this description (a pip "
                             "requirements file as a framework's envs/NAME.txt: another framework version); repeatable")
    sp.add_argument("--split", type=fraction, help="decide only whether B is slower than A by more than this fraction "
                                                "(what bisect asks of each commit)")
    _ab_options(sp)
    sp.set_defaults(func=cmd_ab)


def cmd_bisect(args: argparse.Namespace) -> None:
    from harness.comparison.bisect import ab_argv, bisect

    bisect(_repo(), args.good, args.bad, Path(args.config), Path(args.out), ab_argv(_ab_limits(args)),
           confirmed_by=Path(args.confirmed_by) if args.confirmed_by else None, framework=args.framework)


def _bisect(sub: argparse._SubParsersAction) -> None:
    sp = sub.add_parser("bisect", help="the first commit between GOOD and BAD that `ab` against GOOD calls slower "
                                       "(git bisect run)")
    sp.add_argument("good", type=git_ref)
    sp.add_argument("bad", type=git_ref)
    sp.add_argument("--confirmed-by", type=nonempty, metavar="AB_DIR",
                    help="an `ab` of GOOD against BAD under this config that called BAD slower: its round 0, not run "
                         "again")
    _ab_options(sp)
    sp.set_defaults(func=cmd_bisect)


def cmd_nightly(args: argparse.Namespace) -> int:
    from harness.comparison.nightly import EXIT, SUMMARY, nightly
    from harness.regression.ci import append_step_summary
    from harness.report.ab import write_page

    limits = _ab_limits(args)
    budget, framework = limits.pop("max_minutes"), limits.pop("framework")
    record = nightly(_repo(), Path(args.baseline), Path(args.config), Path(args.out), framework=framework,
                     budget=budget, bisect_budget=args.bisect_budget,
                     history_check=Path(args.history_check) if args.history_check else None,
                     results=Path(args.results) if args.results else None, ab_options=limits, render=write_page)
    append_step_summary((Path(args.out) / SUMMARY).read_text())
    print(f"{record['text']} ({args.out}/{SUMMARY})")
    return EXIT.get(record["outcome"], 0)


def _nightly(sub: argparse._SubParsersAction) -> None:
    sp = sub.add_parser("nightly", help="tonight's commit against the baseline's as a paired A/B within --budget, "
                                        "bisected when slower; exit 0 no confirmed slowdown, 1 confirmed, 2 bad input")
    sp.add_argument("--baseline", type=nonempty, required=True, help="the accepted baseline (its commit is arm A)")
    sp.add_argument("--bisect-budget", type=minutes, default=45.0,
                    help="minutes for the bisection after a confirmed slowdown, shared by its rounds (default: "
                         "%(default)s)")
    sp.add_argument("--results", type=nonempty, help="the results folder whose history/nightly/ gets the record")
    sp.add_argument("--history-check", type=nonempty, metavar="ALERTS_JSON",
                    help="tonight's `check` verdict (alerts.json), carried as context")
    _ab_options(sp, budget="--budget")
    sp.set_defaults(func=cmd_nightly)


COMMANDS = (_ab, _bisect, _nightly)
