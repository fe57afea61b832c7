"""Every git call of the harness, and the one check of a commit id read from a file.

A checkout's own `.git/config` can name programs git runs on ordinary commands: `core.fsmonitor` runs on `status`
and `diff`, hooks on `worktree add` and `bisect` checkouts, an external diff or textconv driver on `diff`. The
harness runs git in checkouts it did not make (DeepSpeed-Chat's ReMax code, an A/B arm's clean checkout, a clone a
bundle's commit is compared in), so each call turns them off. A value read from a record (a manifest's commit) is
passed only after `commit_id` has checked it is a full object name: never as something git could read as an option.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from harness import HarnessError
from harness.results.records import COMMIT_ID

# Put before the subcommand: they win over the checkout's config (later -c and command-line settings win).
SAFE_CONFIG = ("-c", "core.fsmonitor=false", "-c", "core.hooksPath=/dev/null")
# For `diff`: the checkout's external diff and textconv programs stay off too.
NO_DIFF_PROGRAMS = ("--no-ext-diff", "--no-textconv")


def argv(repo: str | Path, *args: str) -> list[str]:
    """The argv of `git ARGS` in `repo` with the checkout's programs off (SAFE_CONFIG)."""
    return ["git", *SAFE_CONFIG, "-C", str(repo), *args]


def run(repo: str | Path, *args: str) -> subprocess.CompletedProcess:
    """`git ARGS` in `repo`, its output captured as text; never raises for git's own exit code."""
    return subprocess.run(argv(repo, *args), capture_output=True, text=True)


def git(repo: str | Path, *args: str) -> str:
    """The stripped output of `git ARGS` in `repo`; HarnessError with git's message where it fails."""
    proc = run(repo, *args)
    if proc.returncode:
        raise HarnessError(f"git {' '.join(args)[:300]}: {(proc.stderr.strip() or proc.stdout.strip())[:2000]}")
    return proc.stdout.strip()


def is_commit_id(value: object) -> bool:
    """Whether `value` is a full hex object name (what `git rev-parse HEAD` prints), nothing git could read as an
    option, a range or a path."""
    return isinstance(value, str) and COMMIT_ID.fullmatch(value) is not None


def commit_id(value: object, where: str) -> str:
    """`value` where it is a full hex object name; HarnessError naming `where` otherwise."""
    if not is_commit_id(value):
        raise HarnessError(f"{where}: {str(value)[:80]!r} is not a full hex commit id (40 or 64 hex digits)")
    return str(value)
