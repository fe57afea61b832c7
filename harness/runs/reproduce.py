"""`remax-bench reproduce RUN_DIR`: run a finished run again from what its manifest recorded, and say whether it
reproduced (docs/reproducibility.md).

First what the run depended on is checked against now: every input by sha256, the harness commit, the packages of
the environment the run used (the harness's for an embedded backend, the framework's own for a planned one) and the
machine. Any difference stops it before it runs ("could not reproduce", exit 2), naming each difference: a rerun on
other inputs or versions says nothing about determinism. Otherwise the run is made again, with its recorded config and
seed, into a directory of its own (never over the original), and compared step by step with the original
(harness.results.reproducibility): identical, or the first step and metric where it diverged, with both values.
"""

from __future__ import annotations

from pathlib import Path

from harness import HarnessError
from harness.config import validate_config
from harness.frameworks.launch import environment_packages
from harness.inputs import resolve_inputs
from harness.io import check_replaceable, config_hash, write_json
from harness.results import layout
from harness.results.records import read_manifest
from harness.results.reproducibility import first_divergence, verdict_text
from harness.runs.train import run_steps, train
from harness.runtime.manifest import git_commit, hardware, package_versions

RECORD = "reproduce.json"
RECORD_ROLE = "rerun record"  # what RECORD is (harness.io.WRITTEN)


def _changed(what: str, recorded: dict, now: dict) -> list[str]:
    return [f"{what} {k}: recorded {recorded.get(k)!r}, now {now.get(k)!r}"
            for k in sorted(set(recorded) | set(now)) if recorded.get(k) != now.get(k)]


def _freeze(lines: list[str] | None) -> dict:
    """`pip freeze` lines as {package: version}."""
    return dict(line.partition("==")[::2] for line in lines or [])


def differences(manifest: dict, config: dict, inputs_dir: Path) -> list[str]:
    """What differs between the run's recorded world and this machine now; empty when the rerun is a fair test."""
    out = []
    if config_hash(config) != manifest["config_hash"]:
        out.append(f"config: the recorded config hashes to {config_hash(config)}, the manifest says "
                   f"{manifest['config_hash']}")
    try:
        now = resolve_inputs(inputs_dir)
    except HarnessError as e:
        out.append(f"inputs: {e}")
    else:
        out += [f"input {name}: sha256 recorded {rec.get('sha256')}, now {now.get(name, {}).get('sha256')}"
                for name, rec in manifest["inputs"].items() if rec.get("sha256") != now.get(name, {}).get("sha256")]
    return out + world_differences(manifest, config)


def world_differences(manifest: dict, config: dict) -> list[str]:
    """What differs between the run's recorded world (harness commit, packages, machine) and this one now."""
    out = []
    recorded_git, git = manifest.get("git", {}), git_commit()
    if recorded_git.get("commit") != git["commit"]:
        out.append(f"harness commit: recorded {recorded_git.get('commit')}, now {git['commit']}")
    env = manifest.get("environment")
    if env is None:  # an embedded backend runs in the harness's environment
        recorded = manifest.get("versions", {})
        out += _changed("package", recorded, package_versions([k for k in recorded if k not in ("harness", "python")]))
    else:
        out += _changed("package of environment " + str(env.get("name")), _freeze(env.get("packages")),
                        _freeze(environment_packages(env.get("name"), config)))
    recorded_hw, hw = manifest.get("hardware", {}), hardware()
    out += _changed("machine", {k: recorded_hw.get(k) for k in hw}, hw)
    return out


def reproduce(run_dir: str | Path, out: str | Path, inputs_dir: str | Path | None = None,
              timeout_min: float | None = None) -> dict:
    """Run `run_dir` again into `out`; the record written to out/RECORD. HarnessError when it cannot be a fair
    rerun (naming every difference) or when `out` is the original."""
    run_dir, out = Path(run_dir), Path(out)
    if out.resolve() == run_dir.resolve() or run_dir.resolve() in out.resolve().parents:
        raise HarnessError(f"{out}: the rerun would overwrite the original run {run_dir}; give another --out")
    manifest = read_manifest(run_dir / "manifest.json", ("framework", "seed", "run_id", "config", "config_hash",
                                                         "inputs", "inputs.dataset", "inputs.dataset.path"))
    framework, seed = manifest["framework"], manifest["seed"]
    check_replaceable(out, layout.run_owner(framework, seed))  # before the checks and the run, not after them
    config = validate_config(manifest["config"], source=f"{run_dir}/manifest.json config")
    inputs_dir = Path(inputs_dir) if inputs_dir else Path(manifest["inputs"]["dataset"]["path"]).parent
    found = differences(manifest, config, inputs_dir)
    if found:
        raise HarnessError(f"{run_dir}: could not reproduce: " + "; ".join(found))
    original = run_steps(run_dir, framework)
    divergence = first_divergence(original, train(config, framework, seed, out, inputs_dir, timeout_min))
    record = {"original": str(run_dir), "repeat": str(out), "framework": framework, "seed": seed,
              "run_id": manifest["run_id"], "determinism": config["reproducibility"]["determinism"],
              "verdict": "identical" if divergence is None else "diverged", "divergence": divergence,
              "text": verdict_text(divergence), "compared": "per-step behaviour (rewards, KL, tokens, lengths, "
              "accuracy); sampled responses are not in the common schema",
              "caveats": ["the original ran from a working tree with uncommitted changes: its commit does not pin "
                          "its code"] if manifest.get("git", {}).get("dirty") else []}
    write_json(out / RECORD, record, role=RECORD_ROLE)
    return record
