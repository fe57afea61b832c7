"""`remax-bench`: one subcommand per stage of the data flow (docs/design.md); Snakemake rules are thin calls of these.

The subcommands live beside their stage's kind of work: `pipeline` (inputs, freezing the config, summaries,
conformance, the report), `runs` (one run's stages, `train`, `reproduce`), `publish` (a comparison as one file: bundle,
unbundle), `machine` (environments, images, the reward server, the preflight), `regression` (history, baselines, the
nightly check) and `comparison` (A/B, bisect). Each module lists its subcommands in COMMANDS, each one function that
adds its parser.

One meaning per exit code, for every subcommand (docs/design.md, "Exit codes"): 0 done; 1 a finding against what
was asked: a regression (`check`), B slower (`ab`), a comparison rerun that is not consistent (`reproduce`); 2 bad
input or a problem of the machine (a bad config, log or baseline, an unwritable or full disk,
a failing preflight row), with one line naming the file or key; 3 a bug in remax-bench, with its traceback. Nothing
partial is left as if complete.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback

os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

from harness import HarnessError
from harness.cli import comparison, machine, pipeline, publish, regression, runs

EXIT_BAD_INPUT = 2
EXIT_BUG = 3


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="remax-bench", description=(__doc__ or "").splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    for add in (*pipeline.COMMANDS, *runs.COMMANDS, *publish.COMMANDS, *machine.COMMANDS, *regression.COMMANDS,
                *comparison.COMMANDS):
        add(sub)
    return p


def _os_error(e: OSError) -> str:
    where = ": ".join(str(f) for f in (e.filename, e.filename2) if f is not None)
    return f"{where}: {e.strerror or e}" if where else str(e)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    fail = f"remax-bench {args.command}: error:"
    try:
        rc = args.func(args)  # `check` returns 1 when it finds a regression
    except HarnessError as e:
        print(f"{fail} {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except OSError as e:  # unwritable output, a full disk, a vanished file: the machine, never a regression
        print(f"{fail} {_os_error(e)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except Exception:
        # Anything else is a bug. Python's own exit code for it would be 1, which `check` and the nightly rule read as
        # "regression found".
        traceback.print_exc()
        print(f"remax-bench {args.command}: internal error (a bug in remax-bench; the traceback is above)",
              file=sys.stderr)
        return EXIT_BUG
    return rc or 0
