"""Every file a subcommand reads, fed malformed values that Hypothesis generates: exit 2 with one line naming the file
(or, where the damage happens to leave a valid file, exit 0), never exit 3 with a traceback (docs/design.md, "Exit
codes"). The inputs are the real ones, made by the CLI (a finished reference run, its metrics, summary, history and
baseline) or the framework logs of tests/fixtures; each example damages one file of a fresh copy.

The damage (`damage`): bytes that are not UTF-8, nesting 1,000-30,000 deep (past Python's recursion limit, which
json and PyYAML hit), NaN and Infinity where a number was, a 5,000-digit integer (anywhere, or as the step number of
a framework's step line), a value of the wrong type at a key the file has, a YAML alias bomb, a line one byte past
the bound, any short run of bytes, and a valid file cut short.

Round 2 (#61), the newer subcommands: `bundle` of a results folder with a hostile manifest, config or summary;
`unbundle` and `reproduce` of a hostile bundle (`bundle_damage`: any bytes, a gzip cut short or of other bytes, a tar
with an odd entry or a damaged record); `parity` given a hostile config or input record; `ab` and `bisect` given
hostile arguments, config and `--confirmed-by` record. Every input is one refused before any run starts (an arm that
is not a commit, an input whose sha256 no longer matches), so no example trains. Besides the exit code and the one
line: the line names the file or argument, and nothing is left at --out (nor a temporary beside it).
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import REPO
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from test_exit_codes import BOMB
from test_regression import nights

from harness.cli import main
from harness.io import MAX_LINE_BYTES
from harness.results.summarize import MAX_SUMMARY_BYTES, MAX_SUMMARY_ROWS

FIXTURES = REPO / "tests" / "fixtures"


def remax_bench(*argv: object) -> tuple[int, str]:
    """The CLI in this process (a subprocess per example would take minutes): its exit code and stderr."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            rc = main([str(a) for a in argv])
        except SystemExit as e:  # argparse's own refusals
            rc = int(e.code or 0)
    return rc, err.getvalue()


def _json_paths(value: object, path: tuple = ()) -> list[tuple]:
    """Every key path of a JSON value, each with the type of what is there."""
    found = [path] if path else []
    if isinstance(value, dict):
        for k, v in value.items():
            found += _json_paths(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value[:3]):
            found += _json_paths(v, (*path, i))
    return found


def _set(value: object, path: tuple, new: object) -> object:
    if not path:
        return new
    copy = json.loads(json.dumps(value))
    node = copy
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = new
    return copy


# The step number of a framework's console step line: verl's "step:N - ...", OpenRLHF's "✨ Global step N: {...}".
STEP_NUMBER = re.compile(r"(?:\bstep:|Global step )(\d+)")
OTHER_TYPE = st.one_of(st.none(), st.booleans(), st.text(max_size=8), st.lists(st.integers(), max_size=3),
                       st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
                       st.integers(min_value=-(1 << 70), max_value=1 << 70))


@st.composite
def damage(draw: st.DrawFn, valid: bytes) -> tuple[str, bytes]:
    """(what was done, the damaged bytes) of a valid file; JSON documents and JSON lines get damage at their keys."""
    try:
        text = valid.decode()
        kinds = ["not utf-8", "deep", "non-finite", "huge int", "huge step", "wrong type", "alias bomb", "long line",
                 "bytes", "cut short"]
    except UnicodeDecodeError:  # a binary file (parquet): its own damage
        text, kinds = "", ["bytes", "cut short"]
    lines = text.splitlines(keepends=True)
    kind = draw(st.sampled_from(kinds))
    cut = draw(st.integers(min_value=0, max_value=max(0, len(lines) - 1)))
    line = lines[cut] if lines else ""
    if kind == "not utf-8":
        at = draw(st.integers(min_value=0, max_value=len(valid)))
        return kind, valid[:at] + draw(st.sampled_from([b"\xff\xfe", b"\xc3\x28", b"\xed\xa0\x80"])) + valid[at:]
    if kind == "deep":
        n = draw(st.integers(min_value=1_000, max_value=30_000))
        opener, inner, closer = draw(st.sampled_from([("[", "", "]"), ('{"a": ', "1", "}"), ("- ", "1", "")]))
        nested = opener * n + inner + closer * n
        return kind, "".join([*lines[:cut], nested + "\n", *lines[cut + 1:]]).encode()
    numbers = list(re.finditer(r"(?<![\w.\"])-?\d+(\.\d+)?(e-?\d+)?(?![\w.\"])", line))
    if kind in ("non-finite", "huge int") and numbers:
        m = draw(st.sampled_from(numbers))
        new = draw(st.sampled_from(["NaN", "Infinity", "-Infinity", "1e999", ".nan", ".inf", "nan", "inf"])) \
            if kind == "non-finite" else "9" * draw(st.integers(min_value=4_301, max_value=6_000))
        line = line[:m.start()] + new + line[m.end():]
        return kind, "".join([*lines[:cut], line, *lines[cut + 1:]]).encode()
    steps = [(i, m) for i, text_line in enumerate(lines) for m in STEP_NUMBER.finditer(text_line)]
    if kind == "huge step" and steps:  # Python refuses int() of more than 4,300 digits
        i, m = draw(st.sampled_from(steps))
        huge = "9" * draw(st.integers(min_value=4_301, max_value=6_000))
        return kind, "".join([*lines[:i], lines[i][:m.start(1)] + huge + lines[i][m.end(1):], *lines[i + 1:]]).encode()
    if kind == "wrong type":
        try:
            doc = json.loads(text)
        except ValueError:
            doc = None
        if doc is not None:  # one JSON document
            paths = _json_paths(doc)
            if paths:
                path = draw(st.sampled_from(paths))
                return kind, json.dumps(_set(doc, path, draw(OTHER_TYPE))).encode()
        with contextlib.suppress(ValueError):  # a line of JSON lines
            record = json.loads(line)
            paths = _json_paths(record)
            if paths:
                path = draw(st.sampled_from(paths))
                line = json.dumps(_set(record, path, draw(OTHER_TYPE))) + "\n"
                return kind, "".join([*lines[:cut], line, *lines[cut + 1:]]).encode()
    if kind == "alias bomb":
        return kind, BOMB.encode()
    if kind == "long line":
        return kind, ("".join(lines[:cut]) + "x" * (MAX_LINE_BYTES + 1) + "\n").encode()
    if kind == "cut short" and len(valid) > 1:
        return kind, valid[:draw(st.integers(min_value=1, max_value=len(valid) - 1))]
    return "bytes", draw(st.binary(max_size=300))


DOCUMENT = {"not utf-8", "deep", "alias bomb", "long line"}  # no reader of a whole JSON or YAML file accepts these
ALL_DAMAGE = {"not utf-8", "deep", "non-finite", "huge int", "huge step", "wrong type", "alias bomb", "long line",
              "bytes", "cut short"}
NOT_A_COMMIT = "no-such-ref"  # in the repository the A/B and bisect cases run in (`git_repo`)
STRICT_LINES = {"not utf-8", "deep", "long line"}  # JSON lines the harness writes itself
# A framework's console, read with undecodable bytes replaced (a killed process may cut a character in two), where a
# line that is not a step line is skipped: only a line past the bound, or a step line's number past 2**53, must be
# refused.
CONSOLE = {"long line", "huge step"}


class Case:
    """A subcommand, one of its input files (`target`, relative to a fresh copy of `source`), its arguments, and the
    damage it must refuse (exit 2) whatever else it reads. `out`: where it writes, given the copy (nothing may be
    there after a refusal); `named`: what its one line may name, given the copy (default: the copy, a file in it);
    `undamaged`: its exits on the input as it is, or None where that input would start a run (it is never given,
    and damage that leaves the file as it was is skipped); `examples`: Hypothesis' examples of damage."""

    def __init__(self, source: Callable[[dict], Path], target: str | Callable[[Path], str],
                 argv: Callable[[Path, dict], list], refuses: set[str], *, out: Callable[[Path], Path] | None = None,
                 named: Callable[[Path], tuple[str, ...]] = lambda d: (str(d),),
                 undamaged: tuple[int, ...] | None = (0,),
                 examples: int = 25) -> None:
        self.source, self.target, self.argv, self.refuses = source, target, argv, refuses
        self.out, self.named, self.undamaged, self.examples = out, named, undamaged, examples


def _metrics_dir(t: dict) -> Path:
    return t["metrics"].parent


def _dataset_from_file(d: Path, t: dict) -> list:
    """`inputs dataset` of a config whose task is the prompt file in `d` (tests/test_datasets.py's GSM8K sample)."""
    config = d / "task.yaml"
    config.write_text(json.dumps({"task": {"kind": "file", "path": str(d / "gsm8k-sample.jsonl"),
                                           "prompt_key": "question", "split_key": "split"}}))
    return ["inputs", "dataset", "--config", config, "--inputs", d / "new-inputs"]


CASES = {
    "config (inputs dataset)": Case(lambda t: t["config"].parent, "config.yaml",
                                    lambda d, t: ["inputs", "dataset", "--config", d / "config.yaml",
                                                  "--inputs", d / "new-inputs"], DOCUMENT),
    "frozen config (summarize)": Case(lambda t: t["root"] / "results", "config.json",
                                      lambda d, t: ["summarize", "--config", d / "config.json", "--metrics",
                                                    t["metrics"], "--out", d / "new.csv"], DOCUMENT),
    "step log (ingest reference)": Case(lambda t: t["run"], "steps.jsonl",
                                        lambda d, t: ["ingest", "reference", d / "steps.jsonl", "--out",
                                                      d / "new.parquet"], STRICT_LINES),
    "metrics (summarize)": Case(_metrics_dir, "seed1.parquet",
                                lambda d, t: ["summarize", "--config", t["config"], "--metrics", d / "seed1.parquet",
                                              "--out", d / "new.csv"], DOCUMENT),
    "eval record (summarize)": Case(lambda t: t["run"], "eval.json",
                                    lambda d, t: ["summarize", "--config", t["config"], "--metrics", t["metrics"],
                                                  "--runs", d, "--out", d.parent / "new.csv"], DOCUMENT),
    "summary (report)": Case(lambda t: t["root"] / "results", "summary.csv",
                             lambda d, t: ["report", t["root"] / "results", "--summary", d / "summary.csv",
                                           "--out", d.parent / "new-report"], set()),
    "manifest (reproduce)": Case(lambda t: t["run"], "manifest.json",
                                 lambda d, t: ["reproduce", d, "--out", d.parent / "rerun", "--inputs", t["inputs"]],
                                 DOCUMENT, undamaged=(0, 2)),
    "baseline (check)": Case(lambda t: t["history"].parent, "baseline.json",
                             lambda d, t: ["check", "--baseline", d / "baseline.json", "--results", t["history"]],
                             DOCUMENT),
    "config as --json (freeze-config)": Case(
        lambda t: t["root"] / "results", "config.json",
        lambda d, t: ["freeze-config", "--json", (d / "config.json").read_bytes().decode(errors="surrogateescape"),
                      "--out", d / "new.json"], {"deep", "alias bomb"}, named=lambda d: ("--json", "snakemake config")),
    "history (baseline update)": Case(lambda t: t["history"],
                                      lambda d: min(f"history/{p.name}" for p in (d / "history").glob("*.jsonl")),
                                      lambda d, t: ["baseline", "update", "--results", d, "--out", d / "new.json"],
                                      STRICT_LINES),
    "prompt dataset (inputs dataset, task.kind file)": Case(lambda t: FIXTURES / "datasets", "gsm8k-sample.jsonl",
                                                            _dataset_from_file, STRICT_LINES),
    "OpenRLHF log (ingest)": Case(lambda t: FIXTURES / "openrlhf" / "run", "openrlhf.log",
                                  lambda d, t: ["ingest", "openrlhf", d, "--out", d.parent / "new.parquet"], CONSOLE),
    "verl file logger (ingest)": Case(lambda t: FIXTURES / "verl" / "run", "verl_metrics.jsonl",
                                      lambda d, t: ["ingest", "verl", d, "--out", d.parent / "new.parquet"],
                                      {"deep", "long line"}),
    "verl console (ingest)": Case(lambda t: FIXTURES / "verl" / "run", "console.log",
                                  lambda d, t: ["ingest", "verl", d / "console.log", "--out", d.parent / "new.parquet"],
                                  CONSOLE),
    "OpenRLHF plan (ingest)": Case(lambda t: FIXTURES / "openrlhf" / "run", "plan.json",
                                   lambda d, t: ["ingest", "openrlhf", d, "--out", d.parent / "new.parquet"],
                                   DOCUMENT),
    **{f"{what} (bundle)": Case(lambda t: t["root"] / "results", target,
                                lambda d, t: ["bundle", d, "--out", d.parent / "new.tar.gz"], refuses,
                                out=lambda d: d.parent / "new.tar.gz", examples=12)
       for what, target, refuses in (("manifest", "runs/reference/seed1/manifest.json", DOCUMENT),
                                     ("frozen config", "config.json", DOCUMENT), ("summary", "summary.csv", set()))},
    # parity's inputs first: with none there, a config that survives its damage is refused before the batch is made
    "config (parity)": Case(lambda t: t["config"].parent, "config.yaml",
                            lambda d, t: ["parity", "--config", d / "config.yaml", "--inputs", d / "no-inputs",
                                          "--frameworks", "verl", "--out", d.parent / "parity"], DOCUMENT,
                            out=lambda d: d.parent / "parity", undamaged=(2,), examples=12),
    # a file inside an input: any change of its bytes changes the input's sha256, so every example is refused before
    # the batch is trained (the input as it is would start the check, so it is never given). Not a .sha256 sidecar:
    # cut after its digest, it still records the same one
    **{f"input record {target} (parity)": Case(
        lambda t: t["inputs"], target,
        lambda d, t: ["parity", "--config", t["config"], "--inputs", d, "--frameworks", "verl", "--out",
                      d.parent / "parity"], ALL_DAMAGE, out=lambda d: d.parent / "parity", undamaged=None, examples=12)
       for target in ("reward/reward.json", "policy/config.json")},
    # arm B is never a commit: whatever the config's damage leaves, nothing runs
    "config (ab)": Case(lambda t: t["config"].parent, "config.yaml",
                        lambda d, t: ["ab", "--a", "HEAD", "--b", NOT_A_COMMIT, "--config", d / "config.yaml", "--out",
                                      d.parent / "ab"], DOCUMENT, out=lambda d: d.parent / "ab",
                        named=lambda d: (str(d), "arm B"), undamaged=(2,), examples=12),
    "--a-set (ab)": Case(
        lambda t: t["root"] / "results", "config.json",
        lambda d, t: ["ab", "--a", "HEAD", "--b", NOT_A_COMMIT, "--a-set",
                      (d / "config.json").read_bytes().decode(errors="surrogateescape"), "--config", t["config"],
                      "--out", d.parent / "ab"], {"deep", "alias bomb"}, out=lambda d: d.parent / "ab",
        named=lambda d: ("--a-set", "arm B"), undamaged=(2,), examples=12),
    # the record names BAD's arm as another commit: no damage of one field makes it one that stands for round 0
    "--confirmed-by record (bisect)": Case(
        lambda t: t["confirmed"], "ab.json",
        lambda d, t: ["bisect", t["good"], t["bad"], "--config", t["config"], "--confirmed-by", d, "--out",
                      d.parent / "bisect"], DOCUMENT, out=lambda d: d.parent / "bisect", undamaged=(2,), examples=12),
}


def git_repo(root: Path) -> tuple[Path, str, str]:
    """A repository of two commits (GOOD, BAD) for `ab` and `bisect` to resolve their arms in, never this one."""
    def git(*argv: str) -> str:
        who = ["-c", "user.name=remax-bench test", "-c", "user.email=test@remax-bench.invalid"]
        return subprocess.run(["git", "-C", str(root), *who, *argv], check=True, capture_output=True,
                              text=True).stdout.strip()

    root.mkdir()
    git("init", "-q")
    for text in ("good", "bad"):
        (root / "file").write_text(text)
        git("add", "file")
        git("commit", "-qm", text)
    return root, git("rev-parse", "HEAD~1"), git("rev-parse", "HEAD")


@pytest.fixture(scope="module")
def inputs(tiny, tmp_path_factory):
    """`tiny`, with a history of three nights and a baseline written from it by the CLI; its results bundled; a
    repository of two commits and the record of an A/B between them that `bisect --confirmed-by` refuses (arm B ran
    another commit)."""
    root = tmp_path_factory.mktemp("history")
    results = nights(root / "results", 3)
    assert remax_bench("baseline", "update", "--results", results, "--out", root / "baseline.json")[0] == 0
    assert remax_bench("bundle", tiny["root"] / "results", "--out", root / "tiny.tar.gz")[0] == 0
    repo, good, bad = git_repo(root / "repo")
    confirmed = root / "confirmed"
    confirmed.mkdir()
    (confirmed / "ab.json").write_text(json.dumps({
        "arms": {"A": {"commit": good, "override": {}}, "B": {"commit": "f" * 40, "override": {}}},
        "command": f"remax-bench ab --a {good} --b {'f' * 40}", "framework": "reference",
        "config_sha256": hashlib.sha256(tiny["config"].read_bytes()).hexdigest(),
        "verdict": {"verdict": "slower", "text": "B is slower than A by 10%", "change": 0.1}, "pairs": []}, indent=2))
    return {**tiny, "history": results, "bundle": root / "tiny.tar.gz", "repo": repo, "good": good, "bad": bad,
            "confirmed": confirmed}


def refused_alone(rc: int, err: str, what: str, named: tuple[str, ...]) -> None:
    """Exit 0 or 2, never a traceback; on exit 2 one line of `remax-bench CMD: error:`, naming one of `named`."""
    assert rc in (0, 2) and "Traceback" not in err, f"{what}: exit {rc}\n{err[-3000:]}"
    if rc == 2:
        lines = [line for line in err.splitlines() if line.startswith("remax-bench ")]
        assert len(lines) == 1, f"{what}: {err[-2000:]}"
        assert any(n in lines[0] for n in named), f"{what}: names none of {named}: {lines[0][:2000]}"


def left_at(out: Path) -> list[str]:
    """What a refused command left at `out`, or beside it under a temporary name."""
    return [p.name for p in out.parent.iterdir() if p.name == out.name or p.name.startswith(f".{out.name}.")]


@pytest.mark.parametrize("name", sorted(CASES))
def test_malformed_input_is_exit_2_naming_the_file_never_a_traceback(inputs, name, monkeypatch):
    case = CASES[name]
    source = case.source(inputs)
    target = case.target(source) if callable(case.target) else case.target
    valid = (source / target).read_bytes()
    monkeypatch.chdir(inputs["repo"])  # `ab` and `bisect` resolve their arms in the repository they run in

    def on_a_copy(data: bytes) -> tuple[int, str, tuple[str, ...]]:
        """The subcommand on a fresh copy of its inputs, `target` holding `data` (never the inputs themselves); what
        its message may name."""
        with tempfile.TemporaryDirectory() as tmp:
            copy = Path(tmp) / "in"
            shutil.copytree(source, copy)
            (copy / target).write_bytes(data)
            rc, err = remax_bench(*case.argv(copy, inputs))
            if rc != 0 and case.out is not None:
                assert not left_at(case.out(copy)), f"{name}: exit {rc}, yet it left {left_at(case.out(copy))}"
            return rc, err, case.named(copy)

    # undamaged, the input is read (reproduce reruns the run, or stops at an input its manifest names); a case whose
    # undamaged input would start a run is not given it
    if case.undamaged is not None:
        rc, err, _ = on_a_copy(valid)
        assert rc in case.undamaged, err[-2000:]

    @settings(max_examples=case.examples, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(damage(valid))
    def check(damaged: tuple[str, bytes]) -> None:
        what, data = damaged
        assume(case.undamaged is not None or data != valid)
        rc, err, named = on_a_copy(data)
        refused_alone(rc, err, f"{name}, {what}", named)
        if what in case.refuses:
            assert rc == 2, f"{name}, {what}: damage that no reader may accept was accepted"

    check()


def test_the_damage_reaches_every_kind():
    """The generator makes each kind of damage it names, from a JSON document and from JSON lines alike."""
    seen: set[str] = set()
    doc = json.dumps({"a": 1.5, "b": [1, 2], "c": {"d": "x"}}).encode()
    lines = b'{"step": 1, "x": 0.5}\n{"step": 2, "x": 0.25}\n'
    console = "step:1 - a:0.5\n✨ Global step 2: {'a': 0.5}\n".encode()

    @settings(max_examples=300, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(st.sampled_from([doc, lines, console]).flatmap(damage))
    def collect(damaged: tuple[str, bytes]) -> None:
        seen.add(damaged[0])

    collect()
    assert seen >= {"not utf-8", "deep", "non-finite", "huge int", "huge step", "wrong type", "alias bomb",
                    "long line", "bytes", "cut short"}, seen


# --- round 2 (#61): a hostile bundle, hostile arguments ---

def _members(bundle: bytes) -> list[tuple[tarfile.TarInfo, bytes | None]]:
    with tarfile.open(fileobj=io.BytesIO(bundle), mode="r:gz") as tar:
        return [(m, (tar.extractfile(m) or io.BytesIO()).read() if m.isfile() else None) for m in tar.getmembers()]


def _tar(members: list[tuple[tarfile.TarInfo, bytes | None]], tail: bytes = b"") -> bytes:
    """A gzip tar of `members` in order; `tail` (raw tar blocks) after the last of them, in place of the tar's end."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
        end = tar.offset
    return gzip.compress(raw.getvalue()[:end] + tail if tail else raw.getvalue())


def _entry(name: str, kind: bytes = tarfile.REGTYPE, data: bytes | None = b"x", **fields: object) -> tuple:
    info = tarfile.TarInfo(name)
    info.type, info.size = kind, len(data) if data is not None and kind == tarfile.REGTYPE else 0
    for key, value in fields.items():
        setattr(info, key, value)
    return info, data if kind == tarfile.REGTYPE else None


# Every one of these is refused, whatever else the bundle holds (harness.runs.unbundle).
ODD_ENTRIES = ("symlink", "hard link", "absolute path", "dot-dot", "outside the top folder", "device", "fifo",
               "hidden file", "control character", "twice", "not listed", "changed", "size past its data",
               "100,000-byte name")


@st.composite
def bundle_damage(draw: st.DrawFn, valid: bytes) -> tuple[str, bytes]:
    """(what was done, a damaged bundle): any bytes, the bundle cut short, a gzip of other bytes, a tar with one odd
    entry at any place, or its record (bundle.json) damaged as `damage` damages a JSON document."""
    kind = draw(st.sampled_from(["bytes", "cut short", "gzip of bytes", "odd entry", "record"]))
    if kind == "bytes":
        return kind, draw(st.binary(max_size=300))
    if kind == "cut short":
        return kind, valid[:draw(st.integers(min_value=1, max_value=len(valid) - 1))]
    if kind == "gzip of bytes":
        return kind, gzip.compress(draw(st.binary(max_size=2000)))
    members = _members(valid)
    top = members[0][0].name.split("/")[0]
    record = next(i for i, (m, _) in enumerate(members) if m.name == f"{top}/bundle.json")
    files = [i for i, (m, _) in enumerate(members) if m.isfile() and i != record]  # each one's sha256 is recorded
    if kind == "record":
        at = record
        what, data = draw(damage(members[at][1]))
        info = members[at][0]
        info.size = len(data)
        return f"record: {what}", _tar([*members[:at], (info, data), *members[at + 1:]])
    odd = draw(st.sampled_from(ODD_ENTRIES))
    some = members[draw(st.sampled_from(files))]
    if odd == "size past its data":  # a header claiming a terabyte, its data cut after one block
        info, _ = _entry(f"{top}/huge")
        info.size = 1 << 40
        return odd, _tar(members, tail=info.tobuf(tarfile.PAX_FORMAT) + b"x" * 512)
    if odd == "changed":  # one file's bytes, no longer those bundle.json records
        info = some[0]
        data = (some[1] or b"") + b"\n"
        info.size = len(data)
        return odd, _tar([(m, d) if m is not info else (info, data) for m, d in members])
    entry = {"symlink": lambda: _entry(f"{top}/runs/link", tarfile.SYMTYPE, linkname="/etc/passwd"),
             "hard link": lambda: _entry(f"{top}/link", tarfile.LNKTYPE, linkname=some[0].name),
             "absolute path": lambda: _entry("/tmp/remax-bench-evil"),
             "dot-dot": lambda: _entry(f"{top}/../evil"),
             "outside the top folder": lambda: _entry("elsewhere/evil"),
             "device": lambda: _entry(f"{top}/dev", tarfile.CHRTYPE, devmajor=1, devminor=3),
             "fifo": lambda: _entry(f"{top}/fifo", tarfile.FIFOTYPE),
             "hidden file": lambda: _entry(f"{top}/.remax-bench.json", data=b"{}"),
             "control character": lambda: _entry(f"{top}/a\nb"),
             "twice": lambda: _entry(some[0].name, data=b"another"),
             "not listed": lambda: _entry(f"{top}/notes.txt"),
             "100,000-byte name": lambda: _entry(f"{top}/{'a' * 100_000}")}[odd]()
    at = draw(st.integers(min_value=0, max_value=len(members)))
    return odd, _tar([*members[:at], entry, *members[at:]])


def test_the_bundle_damage_reaches_every_kind(inputs):
    seen: set[str] = set()

    @settings(max_examples=300, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(bundle_damage(inputs["bundle"].read_bytes()))
    def collect(damaged: tuple[str, bytes]) -> None:
        seen.add(damaged[0].split(":")[0])

    collect()
    assert seen >= {"bytes", "cut short", "gzip of bytes", "record", *ODD_ENTRIES}, seen


def _files(folder: Path) -> dict[str, bytes]:
    """The files an opened bundle holds (not the harness's own hidden records, which say when it was opened)."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*")
            if p.is_file() and not p.name.startswith(".")}


def test_a_hostile_bundle_is_refused_by_unbundle_and_reproduce(inputs, tmp_path):
    """unbundle and reproduce of a bundle that is not one remax-bench wrote: exit 0 or 2 with one line naming the
    bundle, nothing at --out; an odd entry always refused, and a bundle cut short opened only when the cut spared
    every file (the gzip's trailer: each file's sha256 is checked, not the stream's CRC). reproduce is given an empty
    inputs folder: a bundle that opens is refused there, before a run starts."""
    valid = inputs["bundle"].read_bytes()
    no_inputs = tmp_path / "no-inputs"
    no_inputs.mkdir()

    def both(data: bytes, what: str) -> tuple[list[int], dict[str, bytes]]:
        codes, opened = [], {}
        with tempfile.TemporaryDirectory() as tmp:
            bundle = Path(tmp) / "hostile.tar.gz"
            bundle.write_bytes(data)
            for argv in (["unbundle", bundle, "--out", Path(tmp) / "opened"],
                         ["reproduce", bundle, "--out", Path(tmp) / "rerun", "--inputs", no_inputs]):
                rc, err = remax_bench(*argv)
                refused_alone(rc, err, f"{argv[0]}, {what}", (str(bundle), str(no_inputs)))
                if rc != 0:
                    assert not left_at(argv[3]), f"{argv[0]}, {what}: exit {rc}, yet it left {left_at(argv[3])}"
                codes.append(rc)
            if codes[0] == 0:
                opened = _files(Path(tmp) / "opened")
        return codes, opened

    codes, whole = both(valid, "the bundle as it is")
    assert codes == [0, 2] and whole

    @settings(max_examples=100, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(bundle_damage(valid))
    def check(damaged: tuple[str, bytes]) -> None:
        what, data = damaged
        seen.add(what)
        codes, opened = both(data, what)
        if what in (*ODD_ENTRIES, "bytes", "gzip of bytes"):
            assert codes[0] == 2, f"unbundle, {what}: a bundle no reader may open was opened"
        if what == "cut short" and codes[0] == 0:
            assert opened == whole, f"unbundle, cut at {len(data)} of {len(valid)} bytes: opened other files"

    seen: set[str] = set()
    check()
    assert len(seen & set(ODD_ENTRIES)) >= len(ODD_ENTRIES) // 2, seen  # the odd entries are most of the point


# Refs and values the shell and git read in their own ways: an option, a range, a revision expression, a path, a
# pathspec magic, a newline; and anything else Hypothesis writes (no NUL: no command line can hold one).
HOSTILE_REF = st.one_of(
    st.sampled_from(["-x", "--upload-pack=touch /tmp/x", "HEAD..HEAD", "HEAD~99999", "HEAD@{-1}", ":/good",
                     "../..", "/", "a\nb", "$(touch x)", "@", "HEAD^{tree}", "refs/heads/../x", "x" * 5000, " "]),
    st.text(st.characters(blacklist_characters="\x00"), max_size=40))
HOSTILE_VALUE = st.one_of(st.sampled_from(["nan", "inf", "-1", "0", "1e999", "9" * 5000, "", "x", "1,,2", "3.5"]),
                          st.text(st.characters(blacklist_characters="\x00"), max_size=12))
OPTIONS = ("--seeds", "--max-pairs", "--min-pairs", "--max-minutes", "--resolution", "--alpha", "--framework")


def test_hostile_arguments_to_ab_and_bisect_are_refused_before_a_run(inputs, tmp_path, monkeypatch):
    """Any ref and option values: exit 2 (or argparse's 2) with one line, nothing at --out. BAD (and `ab`'s B) is
    checked not to be a commit of the repository first, so no example can start a run."""
    monkeypatch.chdir(inputs["repo"])

    def an_arm(ref: str) -> bool:
        """Whether `ab` could run `ref`: a commit of the repository, or a checkout of the harness."""
        with contextlib.suppress(OSError):  # a name past the file system's length is no checkout
            if (Path(ref) / "harness").is_dir():
                return True
        return subprocess.run(["git", "rev-parse", "--verify", "--quiet", "--end-of-options", f"{ref}^{{commit}}"],
                              cwd=inputs["repo"], capture_output=True).returncode == 0

    @settings(max_examples=30, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(st.sampled_from(["ab", "bisect"]), HOSTILE_REF, HOSTILE_REF,
           st.lists(st.tuples(st.sampled_from(OPTIONS), HOSTILE_VALUE), max_size=3))
    def check(command: str, a: str, b: str, options: list[tuple[str, str]]) -> None:
        assume(not an_arm(b))
        out = tmp_path / "out"
        refs = ["--a", a, "--b", b] if command == "ab" else [a, b]
        argv = [command, *refs, "--config", inputs["config"], "--out", out,
                *(f"{flag}={value}" for flag, value in options)]
        rc, err = remax_bench(*argv)
        assert rc == 2, f"{argv}: exit {rc}\n{err[-3000:]}"
        # the arm, the option, or a ref too long to be a file's name (the file system's own refusal, naming it)
        refused_alone(rc, err, str(argv), ("arm ", "argument", "min_pairs", *(r for r in (a, b) if len(r) > 255)))
        assert not left_at(out), f"{argv}: it left {left_at(out)}"

    check()


# --- the summary: every reader bounded, nothing in it ignored (#61) ---

def test_a_summary_row_without_framework_version_is_refused_naming_line_and_column(inputs, tmp_path):
    """A run without a framework version fell out of the report's table, whose figure then had no row: a traceback."""
    results = tmp_path / "results"
    shutil.copytree(inputs["root"] / "results", results)
    summary = results / "summary.csv"
    header, row = summary.read_text().splitlines()[:2]
    cells = row.split(",")
    cells[header.split(",").index("framework_version")] = ""
    summary.write_text(f"{header}\n{','.join(cells)}\n")
    rc, err = remax_bench("report", results, "--out", tmp_path / "report")
    assert rc == 2 and f"{summary}:2: framework_version is nan, not a name" in err, err[-3000:]


def _results_with_summary(inputs: dict, where: Path, text: str) -> Path:
    results = where / "results"
    shutil.copytree(inputs["root"] / "results", results)
    (results / "summary.csv").write_text(text)
    return results


def test_a_summary_of_more_rows_than_runs_is_refused_by_every_reader(inputs, tmp_path):
    """A summary of more rows than MAX_SUMMARY_ROWS (well inside the byte bound): the report read it whole and then
    ignored every row of a run it had not planned, exit 0. Now each stage that reads a summary refuses it, naming
    it, before pandas parses it."""
    header, row = (inputs["root"] / "results" / "summary.csv").read_text().splitlines()[:2]
    run_id = row.split(",")[header.split(",").index("run_id")]
    rows = "".join(row.replace(run_id, f"{run_id}-{i}", 1) + "\n" for i in range(MAX_SUMMARY_ROWS))
    results = _results_with_summary(inputs, tmp_path, f"{header}\n{row}\n{rows}")
    assert len((results / "summary.csv").read_bytes()) < MAX_SUMMARY_BYTES
    commands = {"report": ["report", results, "--out", tmp_path / "report"],
                "bundle": ["bundle", results, "--out", tmp_path / "b.tar.gz"],
                "history append": ["history", "append", "--results", results],
                "check": ["check", "--baseline", inputs["history"].parent / "baseline.json", "--results", results],
                "reproduce": ["reproduce", results, "--out", tmp_path / "rerun"]}
    for name, argv in commands.items():
        rc, err = remax_bench(*argv)
        assert rc == 2, f"{name}: exit {rc}\n{err[-2000:]}"
        said = f"{results / 'summary.csv'}: {MAX_SUMMARY_ROWS + 1} rows, more than the {MAX_SUMMARY_ROWS} runs"
        assert said in err, f"{name}: {err[-2000:]}"
    assert not (results / "history").exists() and not any(
        (tmp_path / n).exists() for n in ("report", "b.tar.gz", "rerun"))


def test_a_summary_is_never_read_whole_before_its_size_is_known(inputs, tmp_path):
    """A summary that streams twice MAX_SUMMARY_BYTES (a pipe) is refused after MAX_SUMMARY_BYTES: the reader never
    held more. (Lines of one field: a reader that takes it all parses it in seconds, and fails here, not hangs.)"""
    results = _results_with_summary(inputs, tmp_path, "")
    stream = tmp_path / "summary.csv"
    os.mkfifo(stream)
    sent = [0]

    def write() -> None:
        with contextlib.suppress(BrokenPipeError), open(stream, "wb") as f:
            chunk = b"a\n" * (1 << 19)
            while sent[0] < 2 * MAX_SUMMARY_BYTES:
                f.write(chunk)
                sent[0] += len(chunk)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    rc, err = remax_bench("report", results, "--summary", stream, "--out", tmp_path / "report")
    with contextlib.suppress(OSError):  # a reader that never opened the pipe leaves the writer waiting for one
        os.close(os.open(stream, os.O_RDONLY | os.O_NONBLOCK))
    writer.join(timeout=30)
    assert rc == 2 and f"{stream}: larger than {MAX_SUMMARY_BYTES} bytes; not a summary table" in err, err[-2000:]
    assert sent[0] < 2 * MAX_SUMMARY_BYTES, "the whole stream was read"
