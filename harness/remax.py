"""ReMax (arXiv 2310.10505): REINFORCE whose baseline is the reward of the greedy response; no critic.

KL placement: the penalty goes into the reward, per token (k1 estimator, kl_t = log pi(a_t) - log pi_ref(a_t)),
as in the ReMax paper's DeepSpeed-Chat code and verl's ReMax example (`algorithm.use_kl_in_reward=True`).
Keeping it in the reward, not in the loss, makes the advantage the one quantity every framework's ReMax
computes, so the conformance tests compare like with like. Returns are reward-to-go with gamma 1; the
baseline is the greedy response's task score (no KL: the greedy response is not trained on), subtracted
on every response token; no whitening, no clipping.
"""

from __future__ import annotations

import torch


def response_mask(response_ids: torch.Tensor, eos_id: int) -> torch.Tensor:
    """1 for response tokens up to and including the first EOS, 0 after it (padding, or tokens past EOS)."""
    is_eos = (response_ids == eos_id).long()
    after_eos = (is_eos.cumsum(-1) - is_eos) > 0
    return (~after_eos).float()


def token_level_rewards(scores: torch.Tensor, kl: torch.Tensor, mask: torch.Tensor, kl_coef: float) -> torch.Tensor:
    """Task score on the last response token, minus kl_coef * kl_t on every response token."""
    rewards = -kl_coef * kl * mask
    last = (mask.sum(-1).long() - 1).clamp(min=0)
    rewards[torch.arange(len(scores)), last] += scores * (mask.sum(-1) > 0)
    return rewards


def remax_advantages(token_rewards: torch.Tensor, baselines: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """advantage_t = sum_{t' >= t} r_t' - baseline, on response tokens; 0 elsewhere."""
    masked = token_rewards * mask
    returns = masked.flip(-1).cumsum(-1).flip(-1)
    return (returns - baselines[:, None]) * mask


def policy_gradient_loss(logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """REINFORCE, token-mean over the batch: -sum(A_t * log pi(a_t)) / number of response tokens."""
    return -(advantages.detach() * logprobs * mask).sum() / mask.sum().clamp(min=1)
