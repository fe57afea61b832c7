"""The shared reward as one batched function, whatever its kind: the verifiable rule or a reward model.

Every consumer (the reference backend in-process, the reward server for the frameworks that take a reward over
HTTP) scores through `SharedReward.score(prompts, responses, answers) -> list[float]`, one call per batch, so a
reward model scores a whole batch in one forward pass. `identity` says what scored: kind, what, and its sha256
(of harness/reward/__init__.py for the rule, of the checkpoint directory for a model), which manifests and plans record.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Sequence

from harness import HarnessError, reward

Scorer = Callable[[Sequence[str], Sequence[str], Sequence[str]], list[float]]


@dataclasses.dataclass(frozen=True)
class SharedReward:
    identity: dict  # {"kind": "rule" | "model", "reward": what scores, "sha256": ...}
    score: Scorer  # (prompts, responses, answers) -> one float per response; a model ignores the answers


def rule_identity() -> dict:
    from harness.io import sha256_file

    source = inspect.getsourcefile(reward)
    assert source is not None  # a module loaded from a .py file
    return {"kind": "rule", "reward": f"{reward.__name__}.score", "sha256": sha256_file(source)}


def _rule_score(prompts: Sequence[str], responses: Sequence[str], answers: Sequence[str]) -> list[float]:
    return [reward.score(p, r, a) for p, r, a in zip(prompts, responses, answers)]


def load_shared_reward(reward_input: dict, *, device: str = "auto", batch_size: int = 64,
                       max_length: int = 1024) -> SharedReward:
    """The shared reward described by `resolve_inputs(...)["reward"]` ({"kind", "path", "sha256"})."""
    kind = reward_input.get("kind")
    if kind == "rule":
        return SharedReward(rule_identity(), _rule_score)
    if kind == "model":
        from harness.reward.model import RewardModel

        model = RewardModel(reward_input["path"], device=device, batch_size=batch_size, max_length=max_length)
        return SharedReward({"kind": "model", "reward": str(reward_input["path"]), "sha256": reward_input["sha256"]},
                            model.score)
    raise HarnessError(f"shared reward: unknown kind {kind!r} (expected rule or model)")
