"""Subcommands of one run (harness.runs): its stages as the pipeline's rules call them (run an embedded backend, or
plan, launch and ingest a real framework's run), the whole sequence in one (`train`), and a rerun from its record
(`reproduce`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from harness import HarnessError
from harness.cli.args import MAX_GPUS, at_least, config, minutes, nonempty, seed, with_config, with_inputs


def cmd_run(args: argparse.Namespace) -> None:
    from harness.runs.train import run_embedded

    run_embedded(config(args), args.framework, args.seed, args.out, args.inputs)


def cmd_plan(args: argparse.Namespace) -> None:
    from harness.runs.train import plan

    plan(config(args), args.framework, args.seed, args.out, args.inputs)


def cmd_train(args: argparse.Namespace) -> None:
    from harness.runs.train import METRICS, train

    steps = train(config(args), args.framework, args.seed, args.out, args.inputs, args.timeout_min)
    print(f"{args.out}: {len(steps)} steps ({Path(args.out) / METRICS})")


def _run_plan_train(sub: argparse._SubParsersAction) -> None:
    for name, func, help_ in (("run", cmd_run, "run an embedded backend"),
                              ("plan", cmd_plan, "write a real framework's launch directory, without running it"),
                              ("train", cmd_train, "train one (framework, seed) into a run directory, whatever the "
                                                   "framework: an embedded run, or plan, launch and ingest")):
        sp = sub.add_parser(name, help=help_)
        sp.add_argument("framework", type=nonempty)
        with_config(sp)
        sp.add_argument("--seed", type=seed, required=True)
        sp.add_argument("--out", type=nonempty, required=True)
        with_inputs(sp)
        if name == "train":
            sp.add_argument("--timeout-min", type=minutes,
                            help="a planned framework's timeout (default: the config's)")
        sp.set_defaults(func=func)


def cmd_launch(args: argparse.Namespace) -> None:
    from harness.runs.train import launch

    launch(args.plan_dir, args.out, args.timeout_min, config(args))


def _launch(sub: argparse._SubParsersAction) -> None:
    sp = sub.add_parser("launch", help="run a planned framework run (PLAN_DIR/launch.sh) under a timeout")
    sp.add_argument("plan_dir", type=nonempty)
    sp.add_argument("--out", type=nonempty, required=True, help="run directory (appears only when the run succeeded)")
    sp.add_argument("--timeout-min", type=minutes, required=True)
    with_config(sp)
    sp.set_defaults(func=cmd_launch)


def cmd_ingest(args: argparse.Namespace) -> None:
    from harness.results.metrics import write_metrics
    from harness.runs.train import ingest

    df = ingest(args.framework, args.logs, args.n_gpus)
    write_metrics(df, args.out)
    print(f"{args.out}: {len(df)} steps from {', '.join(args.logs)}")


def _ingest(sub: argparse._SubParsersAction) -> None:
    sp = sub.add_parser("ingest", help="a framework's own logs -> common schema parquet")
    sp.add_argument("framework", type=nonempty)
    sp.add_argument("logs", type=nonempty, nargs="+", help="log files, or run directories")
    sp.add_argument("--out", type=nonempty, required=True)
    sp.add_argument("--n-gpus", type=at_least(0, MAX_GPUS), default=None, help=f"0 to {MAX_GPUS}")
    sp.set_defaults(func=cmd_ingest)


def cmd_reproduce(args: argparse.Namespace) -> int:
    source = Path(args.source)
    if (source / "manifest.json").is_file():  # one run: the bitwise check where the world is the same
        from harness.runs.reproduce import RECORD, reproduce

        if args.frameworks or args.seeds:
            raise HarnessError(f"{source}: one run; --frameworks and --seeds choose among a comparison's runs")
        record = reproduce(source, args.out, args.inputs, args.timeout_min)
        print(f"{record['run_id']}: {record['text']} ({args.out}/{RECORD})")
        return 0
    from harness.report.reproduction import PAGE, write_page
    from harness.runs.reproduce_comparison import RECORD as COMPARISON
    from harness.runs.reproduce_comparison import reproduce_comparison

    record = reproduce_comparison(source, args.out, args.frameworks, args.seeds, args.inputs, args.timeout_min)
    write_page(record, Path(args.out))
    lines = [f"{f['framework']} {f['label']}: {f['verdict']}" for f in record["figures"]
             if f["verdict"] != "consistent"]
    lines += [f"{r['framework']} seed {r['seed']}: did not run again: {r['error']}" for r in record["runs"]
              if r["error"]]
    print("\n".join([f"{source}: {record['verdict']} ({args.out}/{PAGE}, {args.out}/{COMPARISON})", *lines]))
    return 0 if record["verdict"] in ("identical", "consistent") else 1


def _reproduce(sub: argparse._SubParsersAction) -> None:
    sp = sub.add_parser("reproduce", help="run a finished run, a results directory or a bundle again and say whether "
                                          "it reproduced: one run bitwise (identical, or the first divergent step; "
                                          "exit 2 naming what differs when inputs, commit, packages or machine are "
                                          "not the recorded ones); a comparison on any machine, a verdict per "
                                          "figure (exit 1 when one is not consistent)")
    sp.add_argument("source", type=nonempty,
                    help="a run directory, a results directory, or a bundle (remax-bench bundle)")
    sp.add_argument("--out", type=nonempty, required=True, help="the rerun's folder (never the original)")
    sp.add_argument("--inputs", type=nonempty,
                    help="the inputs directory (default: the run's, the results' or the bundle's)")
    sp.add_argument("--frameworks", type=nonempty, nargs="+", help="a comparison's frameworks to rerun (default: all)")
    sp.add_argument("--seeds", nargs="+", type=seed, help="a comparison's seeds to rerun (default: all)")
    sp.add_argument("--timeout-min", type=minutes, help="a planned framework's timeout (default: the config's)")
    sp.set_defaults(func=cmd_reproduce)


COMMANDS = (_run_plan_train, _launch, _ingest, _reproduce)
