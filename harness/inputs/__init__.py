"""The shared inputs every backend starts from, each recorded with its sha256 when built and checked before use."""

from __future__ import annotations

from pathlib import Path

from harness import HarnessError
from harness.inputs import task
from harness.io import (
    SIDECAR_ROLE,
    atomic_path,
    check_replaceable,
    read_json_object,
    record_hash,
    sha256_tree,
    sidecar,
    verify_hash,
    write_json,
)
from harness.reward.shared import rule_identity

DATASET = "dataset.jsonl"
POLICY = "policy"
BUILD_RECORD = "policy.build.json"  # how the policy was built (none for a linked checkpoint)
BUILD_RECORD_ROLE = "policy build record"  # what BUILD_RECORD is (harness.io.WRITTEN)
POLICY_LINK_ROLE = "policy link"  # a linked checkpoint, replaced as a link (harness.io.check_replaceable)
# The shared reward: REWARD/reward.json says which, and for a reward model REWARD/model is the checkpoint
# (trained here, or a link to `reward.path`).
REWARD = "reward"
REWARD_RECORD = "reward.json"
REWARD_RECORD_ROLE = "shared-reward record"  # what REWARD_RECORD is (harness.io.WRITTEN)
REWARD_MODEL = "model"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")  # any of them: a checkpoint has a tokenizer


def check_outputs(*outputs: tuple[Path, dict | str]) -> None:
    """HarnessError unless every input a stage writes (with a folder's owner or a file's role), and the input's
    sha256 sidecar, may be replaced (harness.io.check_replaceable): all checked before the stage writes any, so that a
    refused one leaves none of the others renewed."""
    for path, what in outputs:
        if isinstance(what, dict):
            check_replaceable(path, what)
        else:
            check_replaceable(path, role=what)
        check_replaceable(sidecar(path), role=SIDECAR_ROLE)


def build_dataset(config: dict, inputs_dir: str | Path) -> str:
    path = Path(inputs_dir) / DATASET
    check_outputs((path, task.DATASET_ROLE))
    task.write_dataset(config["task"], path)
    return record_hash(path)


def build_policy(config: dict, inputs_dir: str | Path) -> str:
    """Build the initial policy, or link the checkpoint at `policy.path`; either way record its sha256.
    Prompts longer than remax.max_prompt_length with the policy's tokenizer stop it here, before any run (a linked
    checkpoint without a tokenizer has nothing to measure them by: the preflight reports it)."""
    from harness.inputs.policy import OWNER, check_prompt_lengths, make_policy  # torch and Transformers: this stage's

    inputs_dir = Path(inputs_dir)
    checkpoint = Path(config["policy"]["path"]) if config["policy"]["path"] else None
    check_outputs((inputs_dir / POLICY, POLICY_LINK_ROLE if checkpoint else OWNER))
    if checkpoint is None:
        check_replaceable(inputs_dir / BUILD_RECORD, role=BUILD_RECORD_ROLE)
    has_tokenizer = checkpoint is None or any((checkpoint / name).is_file() for name in TOKENIZER_FILES)
    if has_tokenizer:
        verify_hash(inputs_dir / DATASET)
        dataset = task.read_dataset(inputs_dir / DATASET)
    if checkpoint is None:
        write_json(inputs_dir / BUILD_RECORD, make_policy(dataset, config, inputs_dir / POLICY), role=BUILD_RECORD_ROLE)
        return record_hash(inputs_dir / POLICY)
    if has_tokenizer:
        from transformers import AutoTokenizer

        check_prompt_lengths(AutoTokenizer.from_pretrained(checkpoint), dataset, config["remax"]["max_prompt_length"])
    return link_policy(checkpoint, inputs_dir / POLICY)


def resolve_inputs(inputs_dir: str | Path) -> dict[str, dict]:
    """Every shared input with its path and verified sha256 (HarnessError on a missing or changed input)."""
    inputs_dir = Path(inputs_dir)
    out = {name: {"path": str(inputs_dir / rel), "sha256": verify_hash(inputs_dir / rel)}
           for name, rel in (("dataset", DATASET), ("policy", POLICY))}
    out["reward"] = resolve_reward(inputs_dir)
    return out


def build_reward(config: dict, inputs_dir: str | Path) -> str:
    """The shared reward input: a record of the rule, or a reward-model checkpoint (linked from `reward.path`,
    checked against `reward.sha256` when given, or trained here from the task); its sha256 recorded."""
    rc, inputs_dir = config["reward"], Path(inputs_dir)
    dest, owner = inputs_dir / REWARD, {"kind": "input", "name": REWARD}
    check_outputs((dest, owner))
    with atomic_path(dest, owner=owner) as tmp:
        tmp.mkdir()
        record: dict = {"kind": rc["kind"]}
        if rc["kind"] == "model":
            from harness.inputs import reward_model
            from harness.reward.model import check_checkpoint

            model_dir = tmp / REWARD_MODEL
            if rc["path"]:
                source = Path(rc["path"])
                record.update(origin=str(source.resolve()), **check_checkpoint(source))
                model_dir.symlink_to(source.resolve(), target_is_directory=True)
            else:
                verify_hash(inputs_dir / DATASET)
                verify_hash(inputs_dir / POLICY)
                record.update(reward_model.train_reward_model(
                    task.read_dataset(inputs_dir / DATASET), inputs_dir / POLICY, rc["train"], model_dir,
                    max_new_tokens=config["remax"]["max_response_length"]))
                record.update(check_checkpoint(model_dir))
            record["sha256"] = sha256_tree(model_dir)
            if rc["sha256"] and rc["sha256"] != record["sha256"]:
                raise HarnessError(f"config: at reward.sha256: the reward model {rc['path']} has sha256 "
                                   f"{record['sha256']}, not {rc['sha256']}: a different or changed checkpoint")
        write_json(tmp / REWARD_RECORD, record, role=REWARD_RECORD_ROLE)
    return record_hash(dest)


def resolve_reward(inputs_dir: Path) -> dict:
    """{"kind", "path", "sha256"} of the shared reward: for a model, its checkpoint and the checkpoint's sha256."""
    verify_hash(inputs_dir / REWARD)
    record_path = inputs_dir / REWARD / REWARD_RECORD
    record = read_json_object(record_path, "shared-reward record")
    kind = record.get("kind")
    if kind == "rule":
        identity = rule_identity()  # the rule's source as it is now: a run scores with the code it imports
        return {"kind": "rule", "path": identity["reward"], "sha256": identity["sha256"]}
    if kind == "model":
        # The checkpoint is usually a link to a directory kept elsewhere, which the input's own hash does not
        # follow: hash what it points to now against what was recorded when the input was built.
        model = inputs_dir / REWARD / REWARD_MODEL
        actual = sha256_tree(model)
        if actual != record.get("sha256"):
            raise HarnessError(f"reward model {model} (-> {model.resolve()}): sha256 {actual}, but {record_path} "
                               f"records {record.get('sha256')}: the checkpoint changed after the input was built; "
                               "rebuild it (`remax-bench inputs reward`) or restore the checkpoint")
        return {"kind": "model", "path": str(model), "sha256": actual}
    raise HarnessError(f"{record_path}: unknown reward kind {kind!r}")


def link_policy(checkpoint: Path, dest: Path) -> str:
    if not (checkpoint / "config.json").is_file():
        raise HarnessError(f"config: at policy.path: {checkpoint} is not a Hugging Face checkpoint directory "
                           "(no config.json)")
    with atomic_path(dest, role=POLICY_LINK_ROLE) as tmp:
        tmp.symlink_to(checkpoint.resolve(), target_is_directory=True)
    return record_hash(dest)
