"""ReMax advantage on hand-computed vectors."""

import torch

from harness.remax import policy_gradient_loss, remax_advantages, response_mask, token_level_rewards

EOS = 2


def test_response_mask_keeps_the_first_eos_and_drops_what_follows():
    response = torch.tensor([[5, 6, EOS, 0, 0], [5, EOS, 7, EOS, 9], [5, 6, 7, 8, 9], [EOS, 0, 0, 0, 0]])
    assert response_mask(response, EOS).tolist() == [
        [1, 1, 1, 0, 0],
        [1, 1, 0, 0, 0],
        [1, 1, 1, 1, 1],  # no EOS: truncated at the length limit, every token counts
        [1, 0, 0, 0, 0],
    ]


def test_outcome_reward_advantage_is_score_minus_greedy_score_on_every_response_token():
    mask = torch.tensor([[1.0, 1, 1, 0], [1, 1, 1, 1]])
    rewards = token_level_rewards(torch.tensor([0.5, 1.0]), torch.zeros(2, 4), mask, kl_coef=0.1)
    assert rewards.tolist() == [[0, 0, 0.5, 0], [0, 0, 0, 1.0]]  # score on the last response token
    adv = remax_advantages(rewards, torch.tensor([1.0, 0.25]), mask)
    assert adv.tolist() == [[-0.5, -0.5, -0.5, 0], [0.75, 0.75, 0.75, 0.75]]


def test_kl_penalty_enters_the_reward_to_go():
    mask = torch.tensor([[1.0, 1, 1, 0]])
    kl = torch.tensor([[0.2, -0.4, 1.0, 9.0]])  # the value past EOS must not count
    rewards = token_level_rewards(torch.tensor([1.0]), kl, mask, kl_coef=0.5)
    assert torch.allclose(rewards, torch.tensor([[-0.1, 0.2, 1.0 - 0.5, 0.0]]))
    adv = remax_advantages(rewards, torch.tensor([0.25]), mask)
    # returns = [0.6, 0.7, 0.5], minus the baseline 0.25
    assert torch.allclose(adv, torch.tensor([[0.35, 0.45, 0.25, 0.0]]))


def test_loss_is_token_mean_reinforce_and_does_not_backprop_into_the_advantage():
    logprobs = torch.tensor([[-1.0, -2.0, -3.0]], requires_grad=True)
    adv = torch.tensor([[1.0, 1.0, 0.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    loss = policy_gradient_loss(logprobs, adv, mask)
    assert loss.item() == (1.0 * 1 + 2.0 * 1) / 2
    loss.backward()
    assert logprobs.grad.tolist() == [[-0.5, -0.5, 0.0]] and adv.grad is None
