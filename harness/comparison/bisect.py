"""`remax-bench bisect GOOD BAD`: the first slow commit between GOOD and BAD, found by `git bisect run` with the A/B
against GOOD (harness.comparison.ab; docs/regression.md, "Is B slower than A?")."""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from harness import HarnessError
from harness.comparison.ab import RECORD
from harness.comparison.arms import Arm, resolve_arm
from harness.io import atomic_path, read_json_object, sha256_file, write_json
from harness.runtime.git import argv as git_argv
from harness.runtime.git import commit_id, git

RECORD_ROLE = "bisect record"  # what bisect.json is (harness.io.WRITTEN)


def confirmed(path: Path, good: str, bad: str, config: Path, framework: str | None) -> dict:
    """The record of an `ab` of GOOD against BAD that stands for bisect's round 0 (`--confirmed-by`, the A/B a
    nightly alert asks for first): the same commits and config file, no override or other environment, the same
    framework, and "slower". Anything else is refused, naming what differs."""
    record = read_json_object(path / RECORD, "the A/B record (--confirmed-by)")

    def field(value: object, key: str) -> object:  # a hand-edited or foreign record may hold anything
        return value.get(key) if isinstance(value, dict) else None

    problems = []
    for label, commit in (("A", good), ("B", bad)):
        arm = field(record.get("arms"), label)
        ran = str(field(arm, "commit"))
        if ran != commit:
            problems.append(f"arm {label} ran {ran[:12]}, not {commit[:12]}")
        if field(arm, "override"):
            problems.append(f"arm {label} had a config override")
    if "-env " in str(record.get("command")):
        problems.append("an arm ran an environment of its own (--a-env/--b-env)")
    if record.get("config_sha256") != sha256_file(config):
        problems.append(f"it ran another config than {config} (sha256)")
    if framework and record.get("framework") != framework:
        problems.append(f"it ran {record.get('framework')}, not {framework}")
    if field(record.get("verdict"), "verdict") != "slower":
        problems.append(f"its verdict is {field(record.get('verdict'), 'text')!r}, not slower")
    if problems:
        raise HarnessError(f"bisect --confirmed-by {path}: not an A/B that calls BAD slower than GOOD: "
                           + "; ".join(problems))
    return record


def ab_argv(limits: dict) -> list[str]:
    """`ab`'s options for each round from the limits `remax-bench ab` takes (harness.cli.comparison): the same
    framework, seeds, pairs, time, resolution and level."""
    argv = [f"--{k.replace('_', '-')}={v}" for k, v in limits.items()
            if k not in ("seeds", "together", "as_configured") and v is not None]
    argv += [f"--seeds={','.join(map(str, limits['seeds']))}"] if limits.get("seeds") else []
    argv += ["--as-configured"] if limits.get("as_configured") else []
    return argv + ([] if limits.get("together", True) else ["--one-at-a-time"])


def bisect(repo: Path, good: str, bad: str, config: Path, out: Path, ab_args: list[str],
           say: Callable[[str], None] = print, confirmed_by: Path | None = None,
           framework: str | None = None) -> dict:
    """The first commit between GOOD and BAD that is slow, by `git bisect run` in a worktree of its own; each round's
    comparison is kept in out/rounds/<commit>.

    Round 0 is `ab` of GOOD against BAD, which must call BAD slower: its slowdown D sets the question each later round
    asks of a commit, whether it is slower than GOOD by more than half of D (in log terms), which a noisy machine
    answers in far fewer pairs than "no difference at all". `confirmed_by`: an `ab` of GOOD against BAD already run
    (checked by `confirmed`) is round 0, and is not run again."""
    repo, out = repo.resolve(), out.resolve()
    arms = (Arm("GOOD", good), Arm("BAD", bad))
    for arm in arms:
        resolve_arm(arm, repo, out)  # a clean checkout's path as well as a ref: its commit, checked as a full id
    good_commit, bad_commit = (commit_id(arm.commit, f"bisect {arm.label}") for arm in arms)
    if confirmed_by is not None:
        confirmed(confirmed_by, good_commit, bad_commit, config, framework)
    with atomic_path(out, owner={"kind": "bisect"}) as tmp:
        tmp.mkdir()
        tree = tmp / "tree"
        (tmp / "rounds").mkdir()
        git(repo, "worktree", "add", "--detach", "--", str(tree), bad_commit)
        # The driver is this checkout's harness, whatever commit the bisection has checked out in `tree` (the current
        # directory there: -P keeps it off the import path). An argv, not a shell line: no path or argument is ever
        # read by a shell.
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}

        def step(extra: list[str]) -> list[str]:
            return [sys.executable, "-P", "-m", "harness.comparison.bisect", good_commit, str(config.resolve()),
                    str(tmp / "rounds"), *ab_args, *extra]

        try:
            if confirmed_by is None:
                first = subprocess.run(step([]), cwd=tree, env=env, capture_output=True, text=True)
                head, slower = first.stdout + first.stderr, first.returncode == 1
            else:
                shutil.copytree(confirmed_by, tmp / "rounds" / bad_commit)
                head, slower = f"GOOD against BAD: {confirmed_by} (--confirmed-by, not run again)\n", True
            bad_record = tmp / "rounds" / bad_commit / RECORD
            if not slower or not bad_record.is_file():
                raise HarnessError(f"bisect: BAD ({bad_commit[:12]}) is not shown slower than GOOD "
                                   f"({good_commit[:12]}), nothing to bisect:\n{head[-2000:]}")
            split = 1 - math.sqrt(1 - read_json_object(bad_record, "ab record")["verdict"]["change"])
            say(f"remax-bench bisect: BAD is slower; each commit is placed against a slowdown of {100 * split:.1f}%")
            git(tree, "bisect", "start", bad_commit, good_commit)
            proc = subprocess.run(git_argv(tree, "bisect", "run", *step([f"--split={split}"])), env=env,
                                  capture_output=True, text=True)
            (tmp / "bisect.log").write_text(head + proc.stdout + proc.stderr)
            found = [line.split()[0] for line in proc.stdout.splitlines() if line.endswith("is the first bad commit")]
            git(tree, "bisect", "reset")
        finally:
            git(repo, "worktree", "remove", "--force", "--", str(tree))
        if proc.returncode or not found:
            raise HarnessError(f"bisect: git bisect run did not name a first slow commit (exit {proc.returncode}):\n"
                               f"{(proc.stdout + proc.stderr)[-2000:]}")
        rounds = []
        for d in sorted((tmp / "rounds").iterdir(), key=lambda p: p.stat().st_mtime):
            rec = read_json_object(d / RECORD, "ab record")
            rounds.append({"commit": d.name, "verdict": rec["verdict"]["text"], "pairs": len(rec["pairs"])})
        record = {"good": good_commit, "bad": bad_commit, "first_slow": found[0], "split": split,
                  "confirmed_by": str(confirmed_by) if confirmed_by else None,
                  "subject": git(repo, "log", "-1", "--format=%s", found[0]),
                  "verdict": next(r["verdict"] for r in rounds if r["commit"] == found[0]), "rounds": rounds}
        write_json(tmp / "bisect.json", record, role=RECORD_ROLE)
        say(f"remax-bench bisect: first slow commit {found[0][:12]} ({record['subject']}): {record['verdict']}; "
            f"{len(rounds) - 1} A/B rounds after GOOD against BAD"
            f"{' (' + str(confirmed_by) + ', not run again)' if confirmed_by else ''}, "
            f"{sum(r['pairs'] for r in rounds)} pairs in all")
    return record


def step(argv: list[str]) -> int:
    """One round of `git bisect run`, in the bisection's worktree (the current directory): `ab` of GOOD against the
    commit checked out there, into ROUNDS/<commit>. argv: GOOD CONFIG ROUNDS [ab's options]. Its exit as git bisect
    reads it: 0 good, 1 bad (slower), 125 skip (ab inconclusive: 4), 128 stop the bisection (an error)."""
    good, config, rounds, *ab_args = argv
    commit = git(Path.cwd(), "rev-parse", "HEAD")
    rc = subprocess.run([sys.executable, "-P", "-m", "harness.cli", "ab", "--a", good, "--b", commit, "--config",
                         config, "--out", str(Path(rounds) / commit), *ab_args]).returncode
    return 125 if rc == 4 else 128 if rc >= 2 or rc < 0 else rc


if __name__ == "__main__":
    sys.exit(step(sys.argv[1:]))
