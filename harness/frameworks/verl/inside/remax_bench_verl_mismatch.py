"""The rollout/trainer mismatch (issue #51) in verl's own step metrics, runs in verl's environment.

verl/__init__.py imports every module named in VERL_USE_EXTERNAL_MODULES (utils/import_utils.import_external_libs) in
each process that imports verl; the plan (harness/frameworks/verl/plan.py) names this one and puts this folder on
PYTHONPATH. It wraps verl.utils.debug.metrics.calculate_debug_metrics, which verl 0.9.1's legacy trainer
(trainer/ppo/ray_trainer.py, RayPPOTrainer.fit, trainer.use_v1=False) imports at call time right after the actor
recomputed old_log_probs, whenever the rollout returned its own log-probs (rollout.calculate_log_probs): replacing the
module's attribute is enough. verl's own figures there are probability differences; this adds, over the step's
response tokens (response_mask: the sampled rows only, ReMax's greedy baselines are not in the batch), with
delta = rollout_log_probs - old_log_probs:
- remax_bench/rollout_logprob_abs_diff_mean: mean |delta|
- remax_bench/rollout_token_mult_prob_error: mean exp(|delta|), NeMo-RL's token_mult_prob_error
The signed mean is verl's own rollout_corr/kl (trainer/ppo/rollout_corr_helper.py, compute_offpolicy_metrics).
It changes nothing verl computes: it reads the batch and adds two keys to the step's metrics.
"""

from typing import Any

import verl.utils.debug.metrics as _metrics

_verl_debug_metrics = _metrics.calculate_debug_metrics
PREFIX = "remax_bench/"


def calculate_debug_metrics(data: Any) -> dict:  # a verl.DataProto
    out = _verl_debug_metrics(data)
    batch = data.batch
    rollout, trainer = batch["rollout_log_probs"], batch["old_log_probs"]
    # as verl's own calculate_debug_metrics picks its mask; a TensorDict's keys(), as ray_trainer.py asks
    mask = batch["response_mask"] if "response_mask" in batch.keys() else \
        batch["attention_mask"][:, -batch["responses"].size(1):]  # noqa: SIM118
    mask = mask.bool().to(rollout.device)
    if rollout.shape == trainer.shape == mask.shape and bool(mask.any()):
        delta = (rollout.double() - trainer.to(rollout.device).double())[mask].abs()
        out[PREFIX + "rollout_logprob_abs_diff_mean"] = delta.mean().item()
        out[PREFIX + "rollout_token_mult_prob_error"] = delta.exp().mean().item()
    return out


if getattr(_metrics.calculate_debug_metrics, "__module__", "") != __name__:  # once, even if imported twice
    _metrics.calculate_debug_metrics = calculate_debug_metrics
