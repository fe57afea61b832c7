"""Runs in DeepSpeed-Chat's CPU environment: the official ReMax code's DeepSpeedReMaxTrainer.compute_loss on the
vectors read from stdin (harness.frameworks.dschat.conformance writes them), its returns (the weights of the
log-probs in its loss) as JSON on the last line of stdout. Usage: python conformance_driver.py CHECKOUT
"""

import json
import sys
import types

import torch


class Tokenizer:
    pad_token_id = 0

    def __call__(self, text: str) -> dict:
        return {"input_ids": [0]}


class Actor:
    """compute_loss's forward pass: only its loss uses the logits, not the returns compared here."""

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                 use_cache: bool = False) -> types.SimpleNamespace:
        return types.SimpleNamespace(logits=torch.zeros(*input_ids.shape, 4))


def main(checkout: str) -> None:
    sys.path[:0] = [checkout + "/step3_rlhf_finetuning", checkout]
    from remax_trainer import DeepSpeedReMaxTrainer

    out = {}
    for name, spec in json.loads(sys.stdin.read()).items():
        case, gamma = spec["case"], spec["gamma"]
        engine = types.SimpleNamespace(actor=Actor(), ref=None, reward=None, tokenizer=Tokenizer())
        args = types.SimpleNamespace(max_answer_seq_len=4, end_of_conversation_token="</s>", actor_zero_stage=0,
                                     reference_zero_stage=0, kl_ctl=case["kl_coef"], gamma=gamma)
        trainer = DeepSpeedReMaxTrainer(engine, args)
        mask = torch.tensor(case["mask"], dtype=torch.long)
        b, t = mask.shape
        kl = torch.tensor(case["kl"], dtype=torch.float32)
        # One prompt token, then the response: logprobs[:, i] scores token i + 1, so response token j sits at i = j.
        inputs = {
            "prompts": torch.zeros(b, 1, dtype=torch.long),
            "logprobs": kl, "ref_logprobs": torch.zeros_like(kl),
            "rewards": torch.tensor(spec["scores"], dtype=torch.float32),
            "baseline_rewards": torch.tensor(case["baselines"], dtype=torch.float32),
            "attention_mask": torch.cat([torch.ones(b, 1, dtype=torch.long), mask], 1),
            "input_ids": torch.zeros(b, t + 1, dtype=torch.long),
        }
        _, returns, _ = trainer.compute_loss(inputs)
        out[name] = {"returns": (returns * mask).tolist(), "clip": trainer.clip_reward_value}
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1])
