"""`remax-bench bisect GOOD BAD`: the first slow commit between GOOD and BAD, found by `git bisect run` with the A/B
against GOOD (harness.comparison.ab; docs/regression.md, "Is B slower than A?")."""

from __future__ import annotations

import math
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from harness import HarnessError
from harness.comparison.ab import RECORD, Arm, git, resolve_arm
from harness.io import atomic_path, read_json_object, sha256_file, write_json


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
    for label, ref in (("GOOD", good), ("BAD", bad)):
        resolve_arm(Arm(label, ref), repo, out)
    good_commit, bad_commit = git(repo, "rev-parse", good), git(repo, "rev-parse", bad)
    if confirmed_by is not None:
        confirmed(confirmed_by, good_commit, bad_commit, config, framework)
    with atomic_path(out, owner={"kind": "bisect"}) as tmp:
        tmp.mkdir()
        tree = tmp / "tree"
        (tmp / "rounds").mkdir()
        git(repo, "worktree", "add", "--detach", str(tree), bad_commit)
        # The driver is this checkout's harness, whatever commit the bisection has checked out in `tree` (the current
        # directory there: -P keeps it off the import path).
        here, q = Path(__file__).resolve().parents[2], shlex.quote

        def step(extra: list[str]) -> str:
            return (f"c=$(git rev-parse HEAD); PYTHONPATH={q(str(here))} {q(sys.executable)} -P -m harness.cli ab "
                    f"--a {good_commit} --b \"$c\" --config {q(str(config.resolve()))} "
                    f"--out {q(str(tmp / 'rounds'))}/\"$c\" {' '.join(map(q, ab_args + extra))}; "
                    "rc=$?; [ $rc -eq 4 ] && exit 125; [ $rc -ge 2 ] && exit 128; exit $rc")

        try:
            if confirmed_by is None:
                first = subprocess.run(["sh", "-c", step([])], cwd=tree, capture_output=True, text=True)
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
            proc = subprocess.run(["git", "-C", str(tree), "bisect", "run", "sh", "-c", step([f"--split={split}"])],
                                  capture_output=True, text=True)
            (tmp / "bisect.log").write_text(head + proc.stdout + proc.stderr)
            found = [line.split()[0] for line in proc.stdout.splitlines() if line.endswith("is the first bad commit")]
            git(tree, "bisect", "reset")
        finally:
            git(repo, "worktree", "remove", "--force", str(tree))
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
        write_json(tmp / "bisect.json", record)
        say(f"remax-bench bisect: first slow commit {found[0][:12]} ({record['subject']}): {record['verdict']}; "
            f"{len(rounds) - 1} A/B rounds after GOOD against BAD"
            f"{' (' + str(confirmed_by) + ', not run again)' if confirmed_by else ''}, "
            f"{sum(r['pairs'] for r in rounds)} pairs in all")
    return record
