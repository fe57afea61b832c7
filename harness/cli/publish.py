"""Subcommands that publish a finished comparison (harness.runs.bundle): `bundle` writes one file holding what a
reader on another machine needs, `unbundle` opens one, checking every entry and every sha256 before anything appears."""

from __future__ import annotations

import argparse

from harness.cli.args import nonempty


def cmd_bundle(args: argparse.Namespace) -> None:
    from harness.runs.bundle import make_bundle

    made = make_bundle(args.results, args.out)
    size = f"{made['bytes'] / 1e6:.1f} MB" if made["bytes"] >= 1e5 else f"{made['bytes'] / 1e3:.1f} kB"
    print(f"remax-bench bundle: {args.results} -> {made['path']}: {made['runs']} runs, {made['files']} files, {size}")


def _bundle(sub: argparse._SubParsersAction) -> None:
    sp = sub.add_parser("bundle", help="a finished results directory as one .tar.gz to publish: config, summary, "
                                       "every run's manifest, plan and metrics, the generated inputs, each "
                                       "environment's lock (not the raw logs, checkpoints or repeats)")
    sp.add_argument("results", type=nonempty,
                    help="the results directory (config.json, summary.csv, runs/, metrics/, inputs/)")
    sp.add_argument("--out", type=nonempty, required=True,
                    help="the bundle to write, e.g. NAME.tar.gz (never over anything but a bundle remax-bench wrote)")
    sp.set_defaults(func=cmd_bundle)


def cmd_unbundle(args: argparse.Namespace) -> None:
    from harness.runs.unbundle import describe, open_bundle

    into = open_bundle(args.bundle, args.out)
    record = describe(into)
    print(f"remax-bench unbundle: {args.bundle} -> {into}: {len(record['runs'])} runs, {len(record['files']) + 1} "
          "files, every sha256 as bundle.json records")


def _unbundle(sub: argparse._SubParsersAction) -> None:
    sp = sub.add_parser("unbundle", help="open a bundle into a folder laid out like a results directory; exit 2 "
                                         "naming the entry for a link, a path outside the bundle, a file changed, "
                                         "missing or added, or a damaged tar (nothing is written then)")
    sp.add_argument("bundle", type=nonempty, help="a .tar.gz made by `remax-bench bundle`")
    sp.add_argument("--out", type=nonempty, required=True,
                    help="the folder to open it into (new, empty, or an opened bundle)")
    sp.set_defaults(func=cmd_unbundle)


COMMANDS = (_bundle, _unbundle)
