"""The reward model input, trained here when the config names none (reward.kind model, no reward.path).

On the CPU there is no public reward model to start from, so `train_reward_model` makes one the usual way (the
InstructGPT recipe at toy scale): start from the SFT policy, put a scalar head on it, and fit the Bradley-Terry
loss on preference pairs. The pairs come from the verifiable task (the right answer is preferred over a wrong
one for the same prompt), so the model's pair accuracy on held-out prompts can be measured, and so can how far
RL against it drifts from the true task accuracy (reward hacking shows as reward rising while accuracy does not).
The checkpoint is what harness.reward.model loads and scores with.
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from harness import HarnessError
from harness.inputs.policy import fit, load_policy, seed_everything
from harness.io import atomic_path
from harness.reward.model import render

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

# How a wrong answer is made from the right one: the mistakes a small arithmetic policy makes.
CORRUPTIONS = ("digit", "swap", "drop", "extra", "random")


def corrupt(answer: str, how: str, rng: random.Random) -> str:
    """A wrong answer for the same prompt, made `how` (one of CORRUPTIONS); never equal to `answer`."""
    digits = "0123456789"
    for attempt in range(100):
        if attempt == 20:  # e.g. a swap within "5555" cannot change it
            how = "random"
        s = list(answer)
        i = rng.randrange(len(s))
        if how == "digit":
            s[i] = rng.choice(digits.replace(s[i], ""))
        elif how == "swap" and len(s) > 1:
            j = rng.randrange(len(s) - 1)
            s[j], s[j + 1] = s[j + 1], s[j]
        elif how == "drop" and len(s) > 1:
            del s[i]
        elif how == "extra":
            s.insert(rng.randrange(len(s) + 1), rng.choice(digits))
        else:  # "random", and the fallback for a one-digit answer
            s = [rng.choice(digits) for _ in range(len(answer))]
        wrong = "".join(s)
        if wrong != answer:
            return wrong
    raise HarnessError(f"reward model: cannot make a wrong answer from {answer!r}")


def preference_pairs(rows: list[dict], per_prompt: int, seed: int) -> list[dict]:
    """(prompt, chosen = the right answer, rejected = a wrong one, how it is wrong), `per_prompt` per row."""
    rng = random.Random(seed)
    return [{"prompt": r["prompt"], "chosen": r["answer"], "rejected": corrupt(r["answer"], how, rng), "how": how}
            for r in rows for how in rng.sample(CORRUPTIONS, min(per_prompt, len(CORRUPTIONS)))]


def policy_mistakes(policy_dir: str | Path, rows: list[dict], per_prompt: int, max_new_tokens: int,
                    seed: int) -> list[dict]:
    """Pairs whose rejected answer is a wrong response sampled from the policy itself (InstructGPT ranks model
    samples): the reward model then knows the mistakes RL starts from, not only the made-up ones."""
    seed_everything(seed)
    model, tokenizer = load_policy(policy_dir)
    model.eval()
    pairs = []
    for i in range(0, len(rows), 256):
        batch = rows[i:i + 256]
        enc = tokenizer([r["prompt"] for r in batch], padding=True, return_tensors="pt")
        with torch.no_grad():
            out = model.generate(**enc, do_sample=True, temperature=1.0, top_p=1.0, top_k=0,
                                 max_new_tokens=max_new_tokens, num_return_sequences=per_prompt,
                                 pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
        texts = tokenizer.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
        for k, text in enumerate(texts):
            row = batch[k // per_prompt]
            if text.strip() != row["answer"]:
                pairs.append({"prompt": row["prompt"], "chosen": row["answer"], "rejected": text, "how": "policy"})
    return pairs


def _pair_margins(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, pairs: list[dict],
                  batch_size: int) -> torch.Tensor:
    """r(chosen) - r(rejected) per pair, chosen and rejected scored in one forward pass."""
    margins = []
    for i in range(0, len(pairs), batch_size):
        batch = pairs[i:i + batch_size]
        texts = ([render(tokenizer, p["prompt"], p["chosen"]) for p in batch]
                 + [render(tokenizer, p["prompt"], p["rejected"]) for p in batch])
        enc = tokenizer(texts, padding=True, return_tensors="pt")
        scores = model(**enc).logits[:, 0]
        margins.append(scores[:len(batch)] - scores[len(batch):])
    return torch.cat(margins)


def pair_accuracy(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, pairs: list[dict],
                  batch_size: int = 256) -> dict:
    """Fraction of pairs ranked right, overall and by kind of mistake."""
    was_training = model.training
    model.eval()
    with torch.no_grad():
        right = (_pair_margins(model, tokenizer, pairs, batch_size) > 0).tolist()
    model.train(was_training)
    by_how: dict[str, list[bool]] = {}
    for p, ok in zip(pairs, right):
        by_how.setdefault(p["how"], []).append(ok)
    return {"accuracy": sum(right) / len(right), "pairs": len(right),
            "by_mistake": {h: sum(v) / len(v) for h, v in sorted(by_how.items())}}


def train_reward_model(dataset: dict[str, list[dict]], policy_dir: str | Path, train: dict, dest: str | Path,
                       max_new_tokens: int) -> dict:
    """Fit a reward model on train-split pairs (Bradley-Terry), measure it on eval-split pairs, save it to `dest`
    atomically; return the record of how it was made and how well it ranks."""
    seed_everything(train["seed"])
    start = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(policy_dir)
    tokenizer.padding_side = "left"
    # The SFT policy's body with a fresh scalar head: the reward model starts knowing the task's language.
    model = AutoModelForSequenceClassification.from_pretrained(policy_dir, num_labels=1)
    model.config.pad_token_id = tokenizer.pad_token_id
    train_pairs, eval_pairs = (
        preference_pairs(rows, train["pairs_per_prompt"], seed)
        + policy_mistakes(policy_dir, rows, train["policy_samples_per_prompt"], max_new_tokens, seed)
        for rows, seed in ((dataset["train"], train["seed"]), (dataset["eval"], train["seed"] + 1)))
    losses = fit(model, train_pairs, steps=train["steps"], batch_size=train["batch_size"], lr=train["lr"],
                 seed=train["seed"], loss=lambda batch: -torch.nn.functional.logsigmoid(
                     _pair_margins(model, tokenizer, batch, len(batch))).mean())
    held_out = pair_accuracy(model, tokenizer, eval_pairs)
    with atomic_path(dest, owner={"kind": "input", "name": "reward model"}) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
    return {
        "origin": "trained here from the task's preference pairs (Bradley-Terry), starting from the SFT policy",
        "train_pairs": len(train_pairs),
        "steps": len(losses),
        "loss_first": losses[0] if losses else None,
        "loss_last": losses[-1] if losses else None,
        "pair_accuracy_train": pair_accuracy(model, tokenizer, train_pairs[:2000])["accuracy"],
        "pair_accuracy_eval": held_out["accuracy"],
        "eval_pairs": held_out["pairs"],
        "pair_accuracy_eval_by_mistake": held_out["by_mistake"],
        "seconds": time.perf_counter() - start,
    }
