"""`remax-bench reproduce RESULTS_OR_BUNDLE --out DIR`: rerun a whole comparison, on any machine, and give a verdict per
figure (docs/reproducibility.md, "On another machine").

The one refusal is a different input (dataset, policy, reward by sha256): it would not be the same experiment.
Everything else that differs between the original's world and this one (the machine, the packages, the harness
commit) is listed as context, since that is the question: does the comparison hold there? Each chosen (framework,
seed) is trained again through `train`, into DIR/runs; then either every logged figure of every run is equal
("identical", where the world is the same and the runs were strict), or each figure is judged by
harness.results.consistency against what the original's seeds spread. The record is DIR/reproduce.json; the CLI
renders it as DIR/index.html.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import pandas as pd

from harness import HarnessError
from harness.config import validate_config
from harness.frameworks import env_spec, get_adapter
from harness.inputs import resolve_inputs
from harness.io import atomic_path, config_hash, nan_as_null, read_json_object, write_json
from harness.results import layout
from harness.results.consistency import run_figures, throughput_shares, verdicts
from harness.results.metrics import read_metrics
from harness.results.records import read_manifest
from harness.results.reproducibility import first_divergence, greedy_responses, step0_agreement
from harness.results.summarize import edge_means, read_eval, read_summary, summarize
from harness.runs.reproduce import world_differences
from harness.runs.train import METRICS, train
from harness.runs.unbundle import open_bundle
from harness.runtime import envs
from harness.runtime.envs import REPO
from harness.runtime.git import NO_DIFF_PROGRAMS, commit_id
from harness.runtime.git import run as run_git
from harness.runtime.manifest import git_commit

RECORD = "reproduce.json"
RECORD_ROLE = "reproduction record"  # what RECORD is (harness.io.WRITTEN)
OWNER = {"kind": "reproduction"}
REFERENCE = "reference"  # the embedded backend: step-0 agreement is each framework's greedy responses against its


def _original_runs(original: Path, frameworks: list[str] | None, seeds: list[int] | None) -> list[dict]:
    """Each run of the original's summary of a chosen framework (every seed: the spread the rerun is judged against),
    with its manifest and whether its seed is chosen to run again; HarnessError naming a chosen framework or seed the
    original does not have."""
    summary = read_summary(original / layout.SUMMARY)
    have = sorted({(str(r.framework), int(r.seed)) for r in summary.itertuples()})
    choices: list[tuple[str, list, set]] = [("framework", frameworks or [], {f for f, _ in have}),
                                            ("seed", seeds or [], {s for _, s in have})]
    for what, chosen, known in choices:
        unknown = [str(c) for c in chosen if c not in known]
        if unknown:
            raise HarnessError(f"{original}: has no run of {what} {', '.join(unknown)} (it has "
                               f"{', '.join(str(k) for k in sorted(known))})")
    runs = []
    for framework, seed in have:
        if frameworks and framework not in frameworks:
            continue
        run_dir = layout.path(original, layout.RUN, framework=framework, seed=seed)
        manifest = read_manifest(run_dir / "manifest.json", ("framework", "seed", "config_hash", "inputs"))
        runs.append({"framework": framework, "seed": seed, "dir": run_dir, "manifest": manifest,
                     "again": not seeds or seed in seeds,
                     "metrics": layout.path(original, layout.METRICS, framework=framework, seed=seed)})
    if not any(r["again"] for r in runs):  # each choice is known, but no run has both (a failed seed left out)
        raise HarnessError(f"{original}: no run of framework {', '.join(frameworks or ['(any)'])} with seed "
                           f"{', '.join(map(str, seeds or []))}: nothing to run again (its runs: "
                           f"{', '.join(f'{f} seed {s}' for f, s in have)})")
    return runs


def _check_inputs(runs: list[dict], inputs_dir: Path, shown: str) -> None:
    """The one refusal: an input whose sha256 here is not the one every original run recorded. `shown`: the inputs'
    name for the reader (a bundle's are opened in a temporary folder that is gone when the message is read)."""
    now = resolve_inputs(inputs_dir)
    for run in runs:
        for name, recorded in run["manifest"]["inputs"].items():
            if isinstance(recorded, dict) and recorded.get("sha256") != now.get(name, {}).get("sha256"):
                raise HarnessError(
                    f"{shown}: input {name} has sha256 {now.get(name, {}).get('sha256')}, the original's "
                    f"{run['framework']} seed {run['seed']} recorded {recorded.get('sha256')}: not the same "
                    "experiment (give the original's inputs with --inputs)")


def _commit_change(recorded: str, now: str) -> str:
    """`git diff --shortstat` between the original's harness commit and this one, where this clone has both. Both
    are checked to be commit ids first: the recorded one comes from a file someone else wrote."""
    proc = run_git(REPO, "diff", *NO_DIFF_PROGRAMS, "--shortstat", commit_id(recorded, "the original's harness commit"),
                   commit_id(now, "this clone's commit"), "--", "harness", "workflows")
    summary = proc.stdout.strip()
    return (f"harness code from {recorded[:12]} to {now[:12]}: {summary or 'no change in harness/ and workflows/'}"
            if proc.returncode == 0 else f"harness commit {recorded[:12]} is not in this clone: no diff to show")


def _world(runs: list[dict], config: dict) -> list[str]:
    """What differs from the original's world, once per difference (context for the reader, not a refusal), and
    what the harness's code change between the two commits was."""
    seen: dict[str, None] = {}
    for run in runs:
        seen.update(dict.fromkeys(world_differences(run["manifest"], config)))
    now = git_commit()["commit"]
    recorded = {r["manifest"].get("git", {}).get("commit") for r in runs} - {now, None}
    for commit in sorted(recorded) if now else ():
        seen[_commit_change(commit, now)] = None
    return list(seen)


def _threads(reruns: list[dict]) -> list[str]:
    """torch's thread count, where a run took it from its machine (a config that leaves it to torch, or
    OMP_NUM_THREADS) and the rerun's differs: it changes the order of floating-point sums, as another machine does."""
    seen: dict[str, None] = {}
    for r in (r for r in reruns if r["steps"] is not None):
        recorded = r["manifest"].get("torch_threads")
        now = read_json_object(r["dir"] / "manifest.json", "rerun manifest").get("torch_threads")
        if recorded != now:
            seen[f"{r['framework']} torch threads: recorded {recorded}, now {now}"] = None
    return list(seen)


def _check_sources(runs: list[dict], config: dict) -> None:
    """A framework whose code is a source checkout (DeepSpeed-Chat's ReMax) needs it where the config says, as the
    pipeline's NAME_checkout rule makes it: refused up front, naming how, rather than after the other reruns."""
    for framework in sorted({r["framework"] for r in runs if r["again"]}):
        checkout = get_adapter(framework).checkout
        if checkout is not None and not Path(config[framework]["checkout"]).is_dir():
            raise HarnessError(
                f"{framework}: its source checkout {config[framework]['checkout']} is missing here: check out "
                f"{config[framework]['repository']} at {checkout.commit} there (the pipeline's {framework}_checkout "
                "rule does), then reproduce again")


def _build_environments(runs: list[dict]) -> None:
    """The environments the original ran in, built here from this checkout's descriptions (once; later reruns
    reuse them)."""
    for name in sorted({str(r["manifest"]["environment"]["name"]) for r in runs
                        if isinstance(r["manifest"].get("environment"), dict)}):
        envs.ensure_env(name, spec=env_spec(name))


def _evaluation(run_dir: Path) -> tuple[float, dict[str, str] | None]:
    path = run_dir / "eval.json"
    if not path.is_file():
        return math.nan, None
    after = read_eval(path)["eval_accuracy_after"]
    return (math.nan if after is None else float(after)), greedy_responses(read_json_object(path, "eval record"),
                                                                            path)


def _side_figures(side: str, runs: list[dict], target: float, warmup: int) -> tuple[list[tuple], list[tuple]]:
    """Tidy figure rows and (side, framework, seed, tokens/s) rows of one side's runs (each {framework, seed, steps,
    dir})."""
    evaluations = {(r["framework"], r["seed"]): _evaluation(r["dir"]) for r in runs}
    rows, tokens = [], []
    for r in runs:
        accuracy, responses = evaluations[(r["framework"], r["seed"])]
        reference = evaluations.get((REFERENCE, r["seed"]), (math.nan, None))[1]
        agreement = math.nan
        if reference is not None and responses is not None and r["framework"] != REFERENCE:
            found = step0_agreement(reference, responses)
            agreement = found["agree"] / found["n"] if found["n"] else math.nan
        for figure, value in run_figures(r["steps"], accuracy, target, agreement).items():
            rows.append((side, r["framework"], r["seed"], figure, value))
        measured = r["steps"][r["steps"]["step"] > warmup]
        tokens.append((side, r["framework"], r["seed"], float(measured["throughput_tok_s"].median())))
    return rows, tokens


def _target(original: list[dict], fraction: float) -> float:
    """The time-to-reward target of both sides: `fraction` of the original's best framework's median final reward
    (the report's target)."""
    finals = pd.DataFrame([(r["framework"], edge_means(r["steps"].sort_values("step")["reward_mean"])[1])
                           for r in original], columns=["framework", "final"])
    best = float(finals.groupby("framework")["final"].median().max())
    return fraction * best if best > 0 else math.nan


def _rerun(runs: list[dict], config: dict, inputs_dir: Path, out: Path, timeout_min: float | None) -> list[dict]:
    """Each run trained again into out/runs; a run that fails is kept with its error (its figures are missing)."""
    reruns = []
    for r in runs:
        run_dir = layout.path(out, layout.RUN, framework=r["framework"], seed=r["seed"])
        started = time.monotonic()
        try:
            steps = train(config, r["framework"], r["seed"], run_dir, inputs_dir, timeout_min)
        except HarnessError as e:
            reruns.append({**r, "dir": run_dir, "steps": None, "error": str(e).splitlines()[0]})
            continue
        reruns.append({**r, "dir": run_dir, "steps": steps, "error": None, "seconds": time.monotonic() - started})
        print(f"remax-bench reproduce: {r['framework']} seed {r['seed']} ran again "
              f"({time.monotonic() - started:.0f} s)", flush=True)
    return reruns


def judge(original: list[dict], reruns: list[dict], config: dict) -> dict:
    """The verdict on reruns (each {framework, seed, dir, steps}: None where it failed) of the original's runs:
    identical, or consistent or not figure by figure (harness.results.consistency), with both sides' tokens/s."""
    done = [r for r in reruns if r["steps"] is not None]
    steps = {(o["framework"], o["seed"]): o["steps"] for o in original}
    divergences = {(r["framework"], r["seed"]): first_divergence(steps[(r["framework"], r["seed"])], r["steps"])
                   for r in done}
    if len(done) == len(reruns) and all(d is None for d in divergences.values()):
        return {"verdict": "identical", "figures": []}
    target = _target(original, config["report"]["time_to_reward_fraction"])
    warmup = config["remax"]["warmup_steps"]
    rows_o, tokens_o = _side_figures("original", original, target, warmup)
    rows_r, tokens_r = _side_figures("rerun", done, target, warmup)
    figures = pd.DataFrame(rows_o + rows_r, columns=["side", "framework", "seed", "figure", "value"])
    tokens = pd.DataFrame(tokens_o + tokens_r, columns=["side", "framework", "seed", "tokens_per_s"])
    table = verdicts(pd.concat([figures, throughput_shares(tokens)], ignore_index=True))
    failed = [r for r in reruns if r["steps"] is None]
    consistent = not failed and not (table["verdict"] == "not consistent").any()
    return {"verdict": "consistent" if consistent else "not consistent", "target": target,
            "figures": table.to_dict("records"),
            "tokens_per_s": tokens.groupby(["side", "framework"])["tokens_per_s"].median().reset_index()
            .to_dict("records"),
            "divergences": [{"framework": f, "seed": s, **d} for (f, s), d in divergences.items() if d is not None]}


def _probe(steps: list[pd.DataFrame], config: dict) -> float:
    """The median seconds of the fixed torch workload each step timed beside itself (time_probe_s, where a backend
    measures it): how fast each machine was, shown beside the absolute tokens/s."""
    timed = [s.loc[s["step"] > config["remax"]["warmup_steps"], "time_probe_s"] for s in steps if "time_probe_s" in s]
    measured = pd.concat(timed) if timed else pd.Series(dtype=float)
    return float(measured.median()) if measured.notna().any() else math.nan


def reproduce_comparison(source: str | Path, out: str | Path, frameworks: list[str] | None = None,
                         seeds: list[int] | None = None, inputs: str | Path | None = None,
                         timeout_min: float | None = None) -> dict:
    """Rerun the comparison in `source` (a results directory or a bundle) into the folder `out`; its record."""
    source, out = Path(source), Path(out)
    with atomic_path(out, OWNER) as tmp:
        tmp.mkdir()
        original_dir = open_bundle(source, tmp / "original") if source.is_file() else source
        config = validate_config(read_json_object(original_dir / layout.CONFIG, "effective config"),
                                 source=str(original_dir / layout.CONFIG))
        original = _original_runs(original_dir, frameworks, seeds)
        for run in original:
            if run["manifest"]["config_hash"] != config_hash(config):
                raise HarnessError(f"{run['dir']}/manifest.json: config_hash is not the hash of "
                                   f"{original_dir / layout.CONFIG}: the run is not of this comparison")
            run["steps"] = read_metrics(run["metrics"])
        inputs_dir = Path(inputs) if inputs else original_dir / layout.INPUTS
        _check_inputs(original, inputs_dir, str(inputs) if inputs else
                      f"{source}'s {layout.INPUTS}" if source.is_file() else str(inputs_dir))
        _check_sources(original, config)
        _build_environments([r for r in original if r["again"]])
        world = _world(original, config)
        reruns = _rerun([r for r in original if r["again"]], config, inputs_dir, tmp, timeout_min)
        world += _threads(reruns)
        done = [r for r in reruns if r["steps"] is not None]
        probe = {"original": _probe([r["steps"] for r in original], config)}
        if done:
            summary = summarize([r["dir"] / METRICS for r in done],
                                [r["dir"] / "eval.json" for r in done if (r["dir"] / "eval.json").is_file()],
                                config["remax"]["warmup_steps"])
            summary.to_csv(tmp / layout.SUMMARY, index=False)
            probe["rerun"] = _probe([r["steps"] for r in done], config)
        record = {"source": str(source), "original": str(original_dir.resolve() if source.is_dir() else "original"),
                  "world": world, "probe_s": probe, **judge(original, reruns, config),
                  "runs": [{"framework": r["framework"], "seed": r["seed"], "error": r["error"],
                            "seconds": r.get("seconds")} for r in reruns]}
        write_json(tmp / RECORD, nan_as_null(record), role=RECORD_ROLE)
    return record
