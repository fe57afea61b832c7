"""Is B slower than A? `remax-bench ab`: two arms run interleaved on one machine, paired, decided as soon as the
pairs allow (docs/regression.md, "Is B slower than A?").

An arm (harness.comparison.arms) is a commit of this repository with an optional config override and, for a planned
framework, an optional environment description (`--b-env verl-cpu=verl-0.9.2.txt`). Both arms train the config's one
framework on the same seeds from one set of inputs, built once and checked by sha256 in every run's manifest; a
planned framework's runs take its A/B profile (the adapter's `ab_profile`: few steps after warm-up), its start-up
timed apart from the steps. A pair's runs go side by side on cores of their own where the CPU has room (side_by_side;
the arms swap cores each pair, B's ports moved apart), so the machine's moment costs both alike; else in ABBA order.
Pair k uses seed k mod len(seeds). After each pair from the `min_pairs`-th on, harness.comparison.paired decides on
tokens/s, at equal machine speed where both arms' runs time the reference backend's probe alike (decision_basis);
per-phase step times and each seed's ratio are shown with their intervals, with the smallest slowdown the budget can
see; each seed's reward curves are compared step by step, so a change in behaviour is told apart from one in speed.

`remax-bench bisect GOOD BAD` (harness.comparison.bisect) drives `git bisect run` with this comparison.
"""

from __future__ import annotations

import ast
import math
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from harness import HarnessError
from harness.comparison.arms import Arm, cli, finish, merge, separate_ports, set_up, train_run
from harness.comparison.paired import decide, detectable_change, interval, look_alpha
from harness.config import MAX_CONFIG_BYTES
from harness.frameworks import get_adapter
from harness.frameworks.launch import LAUNCH_RECORD
from harness.io import atomic_path, read_document, read_json_object, sha256_file, write_json
from harness.regression.history import sampled_reward_curve
from harness.results.metrics import read_metrics
from harness.results.reproducibility import first_divergence, verdict_text
from harness.runs.train import METRICS
from harness.runtime.git import git

RECORD = "ab.json"
RECORD_ROLE = "A/B record"  # what RECORD is (harness.io.WRITTEN)
OWNER = {"kind": "ab"}  # harness.io.OWNER: a later A/B may replace this one, nothing else may
PHASES = {"throughput_tok_s": "tokens/s", "time_gen_s": "generation", "time_transition_s": "transition",
          "time_train_s": "training"}
# The reference backend's machine-speed probe: a fixed torch workload timed after every step of a CPU run, which a
# shared CPU's drift slows with the step and the run's own code cannot (harness.frameworks.reference.backend).
PROBE = "time_probe_s"
PROBE_MODULE = "harness/frameworks/reference/backend.py"
EQUAL_SPEED = "throughput_equal_speed"
OUTSIDE = "time_outside_steps_s"
FIGURES = {**PHASES, EQUAL_SPEED: "tokens/s at equal machine speed", PROBE: "machine-speed probe (time)",
           OUTSIDE: "outside the steps (start-up, shut-down)"}
EXIT = {"same": 0, "faster": 0, "not slower": 0, "slower": 1, "inconclusive": 4}
MAX_PAIRS = 500  # the sequential boundary is simulated over every look (paired.look_alpha): seconds at this cap


def side_by_side(arms: tuple[Arm, Arm], env: str | None, framework: str) -> list[list[int]] | None:
    """A core set for each run of a pair, where both can run at once on cores of their own, on the CPU with the same
    settings in both arms: the embedded backend with its fixed threads t on 2t cores; a planned framework on half the
    cores each (its processes inherit the set; arms.separate_ports moves B's ports apart); else None."""
    configs = [read_json_object(arm.config, "frozen config") for arm in arms]  # type: ignore[arg-type]
    cores = sorted(os.sched_getaffinity(0))
    if env is not None:
        cpu = all(c["launch"]["device"] == "cpu" for c in configs) and len(cores) >= 2
        return [cores[:len(cores) // 2], cores[len(cores) // 2:]] if cpu and equal(configs, framework) else None
    sections = [c.get("reference") or {} for c in configs]
    threads, device = sections[0].get("threads"), sections[0].get("device")
    if not equal(configs, "reference") or not isinstance(threads, int) or threads < 1:
        return None
    if device == "auto":  # the backend's own rule: CUDA where there is one
        device = "cuda" if __import__("torch").cuda.is_available() else "cpu"
    return [cores[:threads], cores[threads:2 * threads]] if device == "cpu" and len(cores) >= 2 * threads else None


def equal(configs: list[dict], section: str) -> bool:
    return configs[0].get(section) == configs[1].get(section)


def phase_medians(run: Path, warmup: int) -> dict:
    """Each phase's median after warm-up; None for a phase the framework does not time (ab.json holds no NaN)."""
    steps = read_metrics(run / METRICS)
    measured = steps[steps["step"] > warmup]
    medians = {k: float(measured[k].median()) for k in PHASES}
    if not math.isfinite(medians["throughput_tok_s"]):
        raise HarnessError(f"{run}: no tokens/s after warm-up step {warmup} ({len(steps)} steps): nothing to compare")
    # Each step's tokens/s times the probe's seconds right after it: tokens per unit of machine speed. On a shared
    # 2-core VM a process runs up to 1.5x slower than the next at the same commit for most of its life (its CPU time
    # too); the probe slows with it, so this figure varies 4-5x less from run to run than tokens/s does.
    probed = PROBE in measured and bool((measured[PROBE] > 0).all())
    medians[PROBE] = float(measured[PROBE].median()) if probed else math.nan
    medians[EQUAL_SPEED] = float((measured["throughput_tok_s"] * measured[PROBE]).median()) if probed else math.nan
    medians[OUTSIDE] = outside_steps(run, steps)
    return {**{k: v if math.isfinite(v) else None for k, v in medians.items()}, "steps": steps}


def outside_steps(run: Path, steps: pd.DataFrame) -> float:
    """A launched run's seconds outside its steps: its launch's wall time less its step times (the framework's
    start-up and shut-down, apart from the steps the A/B decides on); NaN for an embedded run (no launch)."""
    if not (run / LAUNCH_RECORD).is_file():
        return math.nan
    launched = read_json_object(run / LAUNCH_RECORD, "launch record")
    return float(launched["end"] - launched["start"] - steps["time_step_s"].sum())


def _inputs_of(run: Path) -> dict:
    manifest = read_json_object(run / "manifest.json", "run manifest")
    return {k: v.get("sha256") for k, v in manifest.get("inputs", {}).items() if isinstance(v, dict)}


def compare(repo: Path, config: Path, a: Arm, b: Arm, out: Path, *, framework: str | None = None,
            seeds: list[int] | None = None,
            max_pairs: int = 100, min_pairs: int = 3, max_minutes: float = 15.0, resolution: float = 0.02,
            alpha: float = 0.01, split: float | None = None, together: bool = True, as_configured: bool = False,
            say: Callable[[str], None] = print, render: Callable[[dict, Path], None] | None = None) -> dict:
    """Run the comparison into `out` (appears when complete) and return its record. `split`: decide only whether B
    is slower than A by more than this fraction (paired.decide). `together`: a pair's runs side by side where they
    can be (side_by_side). `as_configured`: the config's steps, not the framework's A/B profile (its adapter's
    `ab_profile`, laid over the config under both arms' overrides). `render(record, dir)`: the page beside the record
    (harness.report.ab), written before `out` appears."""
    repo, out = repo.resolve(), out.resolve()
    if not 2 <= min_pairs <= max_pairs <= MAX_PAIRS:
        raise HarnessError(f"ab: need 2 <= min_pairs ({min_pairs}) <= max_pairs ({max_pairs}) <= {MAX_PAIRS}")
    raw = read_document(config, "config file", max_bytes=MAX_CONFIG_BYTES)
    if not isinstance(raw, dict):
        raise HarnessError(f"ab: --config {config}: not a mapping of config keys")
    frameworks = [framework] if framework else raw.get("frameworks", ["reference"])
    if not isinstance(frameworks, list) or len(frameworks) != 1 or not isinstance(frameworks[0], str):
        raise HarnessError(f"ab: --config {config}: frameworks {frameworks!r}; an A/B runs one framework "
                           "(--framework NAME)")
    raw["frameworks"] = frameworks
    try:  # the framework's A/B profile, from this checkout's registry (the arms' own code checks it again)
        profile = {} if as_configured else get_adapter(frameworks[0]).ab_profile
    except HarnessError as e:
        raise HarnessError(f"ab: {'argument --framework' if framework else f'--config {config}: frameworks'}: {e}") \
            from None
    raw = merge(raw, profile)
    with atomic_path(out, owner=OWNER) as tmp:
        tmp.mkdir()
        try:
            record = _run(repo, config, raw, (a, b), tmp, out, seeds,
                          (max_pairs, min_pairs, max_minutes, resolution, alpha, split), together, say)
        finally:
            for arm in (a, b):
                if arm.worktree and arm.tree is not None and arm.tree.exists():
                    git(repo, "worktree", "remove", "--force", "--", str(arm.tree))
            # gigabytes each, and rebuilt from their descriptions: the record keeps what they held (pip freeze)
            shutil.rmtree(tmp / "envs", ignore_errors=True)
        record["profile"] = profile
        write_json(tmp / RECORD, record, role=RECORD_ROLE)
        if render is not None:
            render(record, tmp)
    return record


def probe_code(tree: Path) -> str | None:
    """The reference backend's probe as a checkout defines it (the method and the lines that make its operands), as
    syntax trees; None where the checkout has none there."""
    try:
        module = ast.parse((tree / PROBE_MODULE).read_text())
    except (OSError, SyntaxError):
        return None
    parts = [ast.dump(n) for n in ast.walk(module) if isinstance(n, ast.FunctionDef) and n.name == "probe"]
    parts += [ast.dump(n) for n in ast.walk(module)
              if isinstance(n, ast.Assign) and any("_probe" in ast.unparse(t) for t in n.targets)]
    return "\n".join(parts) if parts else None


def probe_comparable(arms: tuple[Arm, Arm], env: str | None) -> bool:
    """Whether the probe times the same work in both arms' runs: embedded in this harness's environment (one torch),
    with the same settings for the reference backend (its threads and device) and the same probe code. Where the
    probe's work differs, dividing by it would cancel a change of B's along with the machine's drift."""
    sections = [read_json_object(arm.config, "frozen config").get("reference")  # type: ignore[arg-type]
                for arm in arms]
    codes = [probe_code(arm.tree) for arm in arms]  # type: ignore[arg-type]
    return env is None and sections[0] == sections[1] and codes[0] is not None and codes[0] == codes[1]


def log_ratios(pairs: list[dict], figure: str) -> list[float]:
    return [math.log(p[f"B_{figure}"] / p[f"A_{figure}"]) for p in pairs]


def decision_basis(pairs: list[dict], comparable: bool, alpha: float) -> str:
    """The figure the verdict is decided on: tokens/s at equal machine speed where the probe times the same work in
    both arms (probe_comparable), every run timed it, and its own times do not tell the arms apart at `alpha` (a
    change that slowed the probe too would cancel out of that figure); otherwise tokens/s as measured."""
    if comparable and all(p[f"{arm}_{EQUAL_SPEED}"] for p in pairs for arm in "AB"):
        _, lo, hi = interval(log_ratios(pairs, PROBE), alpha)
        if lo <= 0 <= hi:
            return EQUAL_SPEED
    return "throughput_tok_s"


def run_pair(arms: tuple[Arm, Arm], framework: str, config: dict, seed: int, k: int, inputs: Path, runs: Path,
             logs: Path, cores: list[list[int]] | None) -> dict:
    """Pair k + 1 on `seed`, its runs in `runs`: side by side on `cores` (the first set to A in an even pair, to B in
    an odd one), else one after the other (A first in an even pair). Its figures per arm, and each run's steps."""
    order = arms if k % 2 == 0 else arms[::-1]
    started = []
    for i, arm in enumerate(order):
        run, log = runs / f"pair{k + 1}-{arm.label}-s{seed}", logs / f"{arm.label}.log"
        started.append((arm, run, log, train_run(arm, framework, seed, run, inputs,
                                              config["launch"]["timeout_min"], log, cores[i] if cores else None)))
        if not cores:
            finish(arm, started[-1][3], log, "train")
    figures = {}
    try:
        for arm, run, log, proc in started:
            finish(arm, proc, log, "train")
            figures[arm.label] = {**phase_medians(run, config["remax"]["warmup_steps"]), "inputs": _inputs_of(run)}
    finally:  # a failed run side by side leaves no other run of the pair behind
        for *_, proc in started:
            proc.kill()  # nothing to one that has ended
            proc.wait()
    if figures["A"]["inputs"] != figures["B"]["inputs"]:
        raise HarnessError(f"ab: pair {k + 1}: the arms' runs used other inputs (manifests: "
                           f"{figures['A']['inputs']} against {figures['B']['inputs']})")
    return {"pair": k + 1, "seed": seed, "order": "".join(arm.label for arm in order),
            **{f"{arm}_{p}": figures[arm][p] for arm in "AB" for p in FIGURES},
            "steps": {arm: figures[arm]["steps"] for arm in "AB"}}


def _pairs(arms: tuple[Arm, Arm], framework: str, config: dict, seeds: list[int], tmp: Path,
           logs: Path, limits: tuple[int, int, float, float, float, float | None], started: float,
           say: Callable[[str], None], comparable: bool, cores: list[list[int]] | None) -> tuple[list[dict], dict]:
    """Pairs of runs, side by side on `cores` (each arm on the first set in turn) or in ABBA order, pair k on seed k
    mod len(seeds), until paired.decide stops them (from the `min_pairs`-th pair on) or the pairs or minutes run
    out. Returns the pairs and the last verdict."""
    max_pairs, min_pairs, max_minutes, resolution, alpha, split = limits
    level = look_alpha(alpha, min_pairs, max_pairs)
    pairs: list[dict] = []
    verdict = None
    for k in range(max_pairs):
        seed = seeds[k % len(seeds)]
        pairs.append(run_pair(arms, framework, config, seed, k, tmp / "inputs", tmp / "runs", logs, cores))
        done = len(pairs)
        final = done == max_pairs or (time.monotonic() - started) / 60 >= max_minutes
        if done >= min_pairs or final:  # the time cap may come first: then it is inconclusive
            basis = decision_basis(pairs, comparable, level)
            verdict = {**decide(log_ratios(pairs, basis), level=level, resolution=resolution, final=final,
                                split=split), "basis": basis}
            say(f"remax-bench ab: pair {done} (seed {seed}, {pairs[-1]['order']}): {verdict['text']}")
            if verdict["verdict"] != "continue":
                break
        else:
            say(f"remax-bench ab: pair {done} (seed {seed}, {pairs[-1]['order']}) run")
        if final:
            break
    assert verdict is not None  # the last pair is always final
    return pairs, verdict


def _run(repo: Path, config: Path, raw: dict, arms: tuple[Arm, Arm], tmp: Path, out: Path, seeds: list[int] | None,
         limits: tuple[int, int, float, float, float, float | None], together: bool,
         say: Callable[[str], None]) -> dict:
    a, b = arms
    max_pairs, min_pairs, max_minutes, resolution, alpha, split = limits
    logs = tmp / "logs"
    logs.mkdir()
    frozen, framework, env = set_up(repo, raw, arms, tmp, logs, say)
    seeds = seeds or frozen["seeds"]
    for what in ("dataset", "policy", "reward"):
        cli(a, "inputs", what, "--config", a.config, "--inputs", tmp / "inputs", log=logs / "inputs.log")
    cores = side_by_side(arms, env, framework) if together else None
    if cores and env:
        separate_ports(arms, raw, framework, logs / "B.log")
    started = time.monotonic()
    pairs, verdict = _pairs(arms, framework, frozen, seeds, tmp, logs, limits, started, say,
                            probe_comparable(arms, env), cores)
    level = look_alpha(alpha, min_pairs, max_pairs)
    minutes = (time.monotonic() - started) / 60
    verdict["detectable"] = detectable(pairs, verdict["basis"], level, minutes, max_minutes, max_pairs)
    verdict["text"] += f"; {verdict['detectable']['text']}"
    return {
        "framework": framework,
        "arms": {arm.label: {"spec": arm.spec, "commit": arm.commit, "override": arm.override,
                             "ports": arm.ports, "envs": arm.built} for arm in (a, b)},
        "verdict": verdict, "alpha": alpha, "level": level, "resolution": resolution, "split": split,
        "min_pairs": min_pairs, "max_pairs": max_pairs, "max_minutes": max_minutes,
        "minutes": minutes, "side_by_side": cores,
        "seeds": seeds,
        "pairs": [{k: v for k, v in p.items() if k != "steps"} for p in pairs],
        "phases": _phase_rows(pairs, level),
        "per_seed": _seed_rows(pairs, level, verdict["basis"]), "decided_on": FIGURES[verdict["basis"]],
        "behaviour": _behaviour(pairs),
        "curves": {f"{arm}-s{p['seed']}": sampled_reward_curve(p["steps"][arm])
                   for p in pairs for arm in "AB"},
        "config_sha256": sha256_file(config),
        "command": " ".join(["remax-bench", "ab", "--framework", framework, "--a", a.commit, "--b", b.commit,
                             *(f"--{arm.label.lower()}-env {n}={p}" for arm in (a, b) for n, p in arm.envs.items()),
                             "--config", str(config), "--out", str(out)]),
    }


def detectable(pairs: list[dict], basis: str, level: float, minutes: float, max_minutes: float,
               max_pairs: int) -> dict:
    """What the budget can see: the pairs that fit in `max_minutes` at this A/B's minutes a pair (at most
    `max_pairs`), and the slowdown those pairs call slower 4 times in 5 at the spread measured here."""
    budget_pairs = min(max_pairs, max(len(pairs), math.floor(max_minutes / (minutes / len(pairs)))))
    change = detectable_change(log_ratios(pairs, basis), level, budget_pairs)
    seen = f"{100 * change:.1f}% slowdown 4 times in 5" if change is not None else "change once pairs have a spread"
    text = f"this budget ({max_minutes:g} min, about {budget_pairs} pairs) sees a {seen}"
    return {"change": change, "pairs": budget_pairs, "text": text}


def package_changes(record: dict) -> dict[str, tuple[str | None, str | None]]:
    """Package -> (A's version, B's) where the arms' framework environments differ."""
    versions = {}
    for label, arm in record["arms"].items():
        for e in arm.get("envs", {}).values():
            versions[label] = dict(line.partition("==")[::2] for line in e["packages"])
    if len(versions) < 2:
        return {}
    a, b = versions["A"], versions["B"]
    return {k: (a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)}


def packages_text(changes: dict) -> str:
    """The packages that differ, as the page, the nightly summary and its JUnit failure show them: "name A -> B"."""
    return ", ".join(f"{name} {a or '(none)'} -> {b or '(none)'}" for name, (a, b) in changes.items())


def _ratio_row(name: str, ratios: list[float], alpha: float) -> dict:
    """B/A with its interval; one pair has no spread, so no interval (null in ab.json, which holds no Infinity)."""
    mean, lo, hi = interval(ratios, alpha)
    low, high = (math.exp(x) if math.isfinite(x) else None for x in (lo, hi))
    return {"figure": name, "ratio": math.exp(mean), "low": low, "high": high, "pairs": len(ratios)}


def _phase_rows(pairs: list[dict], alpha: float) -> list[dict]:
    """B/A per phase over all pairs (a time ratio above 1, or a tokens/s ratio below 1, is B slower)."""
    rows = []
    for p, name in FIGURES.items():
        ratios = [math.log(x[f"B_{p}"] / x[f"A_{p}"]) for x in pairs
                  if (x[f"A_{p}"] or 0) > 0 and (x[f"B_{p}"] or 0) > 0]
        if ratios:
            rows.append(_ratio_row(name, ratios, alpha))
    return rows


def _seed_rows(pairs: list[dict], alpha: float, figure: str = "throughput_tok_s") -> list[dict]:
    by_seed: dict[int, list[float]] = {}
    for p in pairs:
        by_seed.setdefault(p["seed"], []).append(math.log(p[f"B_{figure}"] / p[f"A_{figure}"]))
    return [{"seed": s, **_ratio_row(FIGURES[figure], r, alpha)} for s, r in sorted(by_seed.items())]


def _behaviour(pairs: list[dict]) -> list[dict]:
    """Per seed, B's first run against A's first, step by step on what they computed: identical when only speed
    changed."""
    first: dict[int, dict] = {}
    for p in pairs:
        first.setdefault(p["seed"], p["steps"])
    return [{"seed": s, "text": verdict_text(d := first_divergence(runs["A"], runs["B"])), "identical": d is None}
            for s, runs in sorted(first.items())]
