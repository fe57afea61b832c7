"""The shared inputs every backend starts from, each recorded with its sha256 when built and checked before use."""

from __future__ import annotations

import inspect
from pathlib import Path

from harness import HarnessError, reward, task
from harness.io import atomic_path, record_hash, sha256_file, verify_hash, write_json
from harness.policy import make_policy

DATASET = "dataset.jsonl"
POLICY = "policy"


def build_dataset(config: dict, inputs_dir: str | Path) -> str:
    path = Path(inputs_dir) / DATASET
    task.write_dataset(config["task"], path)
    return record_hash(path)


def build_policy(config: dict, inputs_dir: str | Path) -> str:
    """Build the initial policy, or link the checkpoint at `policy.path`; either way record its sha256."""
    inputs_dir = Path(inputs_dir)
    if config["policy"]["path"]:
        return link_policy(Path(config["policy"]["path"]), inputs_dir / POLICY)
    verify_hash(inputs_dir / DATASET)
    dataset = task.read_dataset(inputs_dir / DATASET)
    record = make_policy(dataset, config, inputs_dir / POLICY)
    write_json(inputs_dir / "policy.build.json", record)
    return record_hash(inputs_dir / POLICY)


def resolve_inputs(inputs_dir: str | Path) -> dict[str, dict]:
    """Every shared input with its path and verified sha256 (HarnessError on a missing or changed input)."""
    inputs_dir = Path(inputs_dir)
    out = {name: {"path": str(inputs_dir / rel), "sha256": verify_hash(inputs_dir / rel)}
           for name, rel in (("dataset", DATASET), ("policy", POLICY))}
    reward_src = inspect.getsourcefile(reward)
    out["reward"] = {"path": f"{reward.__name__}.score", "sha256": sha256_file(reward_src)}
    return out


def link_policy(checkpoint: Path, dest: Path) -> str:
    if not (checkpoint / "config.json").is_file():
        raise HarnessError(f"config: at policy.path: {checkpoint} is not a Hugging Face checkpoint directory "
                           "(no config.json)")
    with atomic_path(dest) as tmp:
        tmp.symlink_to(checkpoint.resolve(), target_is_directory=True)
    return record_hash(dest)
