"""Add a "remax" advantage estimator to the OpenRLHF 0.11.2 installed in the running Python environment.

Run it with the OpenRLHF environment's own python (`.venvs/openrlhf/bin/python remax_patch.py`); the launch script
does so before every run. It edits the installed package files, so every process of that environment sees the
change, the Ray workers included (the experience maker runs inside the PPOTrainer Ray actor, where a monkeypatch
in the driver would never arrive); no other environment is touched.

The estimator (ReMax, arXiv 2310.10505): advantage = REINFORCE return (gamma 1) of the reward minus the reward of the
prompt's greedy response, which the ReMax agent (remax_agent.py, --train.agent_func_path) sends with each sample as
extra_logs["remax_baseline"]; the KL penalty stays in the per-token reward as for every OpenRLHF estimator, and
nothing is normalised (OpenRLHF's own estimators all subtract a batch or group mean, or whiten). It also records
each sample's KL summed over its tokens as info["remax_kl_sum"], the harness's kl_mean.

Each edit replaces one exact passage of the 0.11.2 source; if a passage is not found exactly once (another version,
or a file changed by hand) nothing is written and the script exits 2 naming the file. Running it again is a no-op.
Exit status: 0 patched (or already patched), 2 cannot patch.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import sys
import tempfile
from pathlib import Path

VERSION = "0.11.2"
MARKER = "# remax-bench: remax estimator"

EDITS = {
    "cli/train_ppo_ray.py": [(
        '        choices=["gae", "reinforce", "rloo", "reinforce_baseline", "group_norm", "dr_grpo", '
        '"flash_reinforce"],\n',
        '        choices=["gae", "reinforce", "rloo", "reinforce_baseline", "group_norm", "dr_grpo", '
        '"flash_reinforce",\n'
        f'                 "remax"],  {MARKER}\n',
    )],
    "trainer/ppo_utils/experience_maker.py": [
        (
            "            rewards = rewards - rewards.mean()\n"
            "\n"
            "        rewards = rewards.reshape(-1)[indices].split(exp_len)\n",
            "            rewards = rewards - rewards.mean()\n"
            f'        elif args.algo.advantage.estimator == "remax":  {MARKER}\n'
            "            # Baseline = reward of the prompt's greedy response, from the ReMax agent's extra_logs.\n"
            '            if any("remax_baseline" not in experience.info for experience in experiences):\n'
            "                raise ValueError(\n"
            '                    "remax: a sample has no greedy baseline (extra_logs[\'remax_baseline\']); "\n'
            '                    "--train.agent_func_path must be the remax-bench ReMax agent"\n'
            "                )\n"
            "            raw_baselines = torch.cat(\n"
            '                [experience.info["remax_baseline"].reshape(-1) for experience in experiences]\n'
            "            ).to(raw_rewards.dtype)\n"
            "            baselines = torch.empty_like(raw_baselines)\n"
            "            baselines[indices] = raw_baselines  # sorted by original prompt order, as rewards above\n"
            "            rewards = rewards - baselines.reshape(-1, args.rollout.n_samples_per_prompt)\n"
            "\n"
            "        rewards = rewards.reshape(-1)[indices].split(exp_len)\n",
        ),
        (
            '                "flash_reinforce",\n'
            "            ]:\n",
            '                "flash_reinforce",\n'
            f'                "remax",  {MARKER}\n'
            "            ]:\n",
        ),
        (
            '            experience.info["return"] = reward.sum(dim=-1)\n'
            "            experience.kl = None\n",
            '            experience.info["return"] = reward.sum(dim=-1)\n'
            f'            if self.advantage_estimator == "remax":  {MARKER}\n'
            '                experience.info["remax_kl_sum"] = (experience.kl * experience.action_mask).sum(dim=-1)\n'
            "            experience.kl = None\n",
        ),
    ],
}


class PatchError(Exception):
    pass


def package_dir() -> Path:
    spec = importlib.util.find_spec("openrlhf")
    if spec is None or not spec.submodule_search_locations:
        raise PatchError(f"openrlhf is not installed in {sys.prefix}")
    version = importlib.metadata.version("openrlhf")
    if version != VERSION:
        raise PatchError(f"openrlhf {version} is installed in {sys.prefix}; this patch is for {VERSION} only")
    return Path(next(iter(spec.submodule_search_locations)))


def patched_text(path: Path, edits: list[tuple[str, str]]) -> str | None:
    """The file's patched text, or None when it is already patched."""
    text = path.read_text()
    if MARKER in text:
        return None
    for i, (old, new) in enumerate(edits, 1):
        found = text.count(old)
        if found != 1:
            raise PatchError(f"{path}: passage {i} of the {VERSION} source found {found} times (expected once); "
                             "the installed file differs from OpenRLHF " + VERSION)
        text = text.replace(old, new)
    return text


def apply(root: Path) -> list[Path]:
    """Patch the package at `root`; return the files changed. All files are checked before any is written."""
    new_texts = {root / rel: patched_text(root / rel, edits) for rel, edits in EDITS.items()}
    changed = []
    for path, text in new_texts.items():
        if text is None:
            continue
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, path.stat().st_mode)
        os.replace(tmp, path)
        changed.append(path)
    return changed


def main() -> int:
    try:
        root = package_dir()
        changed = apply(root)
    except (PatchError, OSError) as e:
        print(f"remax_patch: error: {e}", file=sys.stderr)
        return 2
    state = ", ".join(str(p.relative_to(root)) for p in changed) if changed else "already patched"
    print(f"remax_patch: openrlhf {VERSION} at {root}: {state}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
