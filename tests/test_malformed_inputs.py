"""Every file a subcommand reads, fed malformed values that Hypothesis generates: exit 2 with one line naming the file
(or, where the damage happens to leave a valid file, exit 0), never exit 3 with a traceback (docs/design.md, "Exit
codes"). The inputs are the real ones, made by the CLI (a finished reference run, its metrics, summary, history and
baseline) or the framework logs of tests/fixtures; each example damages one file of a fresh copy.

The damage (`damage`): bytes that are not UTF-8, nesting 1,000-30,000 deep (past Python's recursion limit, which
json and PyYAML hit), NaN and Infinity where a number was, a 5,000-digit integer (anywhere, or as the step number of
a framework's step line), a value of the wrong type at a key the file has, a YAML alias bomb, a line one byte past
the bound, any short run of bytes, and a valid file cut short.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import REPO
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_exit_codes import BOMB
from test_regression import nights

from harness.cli import main
from harness.io import MAX_LINE_BYTES

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
STRICT_LINES = {"not utf-8", "deep", "long line"}  # JSON lines the harness writes itself
# A framework's console, read with undecodable bytes replaced (a killed process may cut a character in two), where a
# line that is not a step line is skipped: only a line past the bound, or a step line's number past 2**53, must be
# refused.
CONSOLE = {"long line", "huge step"}


class Case:
    """A subcommand, one of its input files (`target`, relative to a fresh copy of `source`), its arguments, and the
    damage it must refuse (exit 2) whatever else it reads."""

    def __init__(self, source: Callable[[dict], Path], target: str | Callable[[Path], str],
                 argv: Callable[[Path, dict], list], refuses: set[str]) -> None:
        self.source, self.target, self.argv, self.refuses = source, target, argv, refuses


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
                                 DOCUMENT),
    "baseline (check)": Case(lambda t: t["history"].parent, "baseline.json",
                             lambda d, t: ["check", "--baseline", d / "baseline.json", "--results", t["history"]],
                             DOCUMENT),
    "config as --json (freeze-config)": Case(
        lambda t: t["root"] / "results", "config.json",
        lambda d, t: ["freeze-config", "--json", (d / "config.json").read_bytes().decode(errors="surrogateescape"),
                      "--out", d / "new.json"], {"deep", "alias bomb"}),
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
}


@pytest.fixture(scope="module")
def inputs(tiny, tmp_path_factory):
    """`tiny`, with a history of three nights and a baseline written from it by the CLI."""
    root = tmp_path_factory.mktemp("history")
    results = nights(root / "results", 3)
    assert remax_bench("baseline", "update", "--results", results, "--out", root / "baseline.json")[0] == 0
    return {**tiny, "history": results}


@pytest.mark.parametrize("name", sorted(CASES))
def test_malformed_input_is_exit_2_naming_the_file_never_a_traceback(inputs, name):
    case = CASES[name]
    source = case.source(inputs)
    target = case.target(source) if callable(case.target) else case.target
    valid = (source / target).read_bytes()

    def on_a_copy(data: bytes) -> tuple[int, str]:
        """The subcommand on a fresh copy of its inputs, `target` holding `data` (never the inputs themselves)."""
        with tempfile.TemporaryDirectory() as tmp:
            copy = Path(tmp) / "in"
            shutil.copytree(source, copy)
            (copy / target).write_bytes(data)
            return remax_bench(*case.argv(copy, inputs))

    # undamaged, the input is read (reproduce then stops at the missing dataset its manifest names: the copy moved)
    assert on_a_copy(valid)[0] == 0 or name == "manifest (reproduce)"

    @settings(max_examples=25, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(damage(valid))
    def check(damaged: tuple[str, bytes]) -> None:
        what, data = damaged
        rc, err = on_a_copy(data)
        assert rc in (0, 2) and "Traceback" not in err, f"{name}, {what}: exit {rc}\n{err[-3000:]}"
        if rc == 2:
            lines = [line for line in err.splitlines() if line.startswith("remax-bench ")]
            assert len(lines) == 1, f"{name}, {what}: {err[-2000:]}"
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
