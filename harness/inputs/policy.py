"""The initial policy: a tokenizer trained here, a small Llama built from the config, a short SFT warm start.

Saved with `save_pretrained`, so the checkpoint directory is what real frameworks load (config.json,
model.safetensors, tokenizer.json with its chat template).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from harness import HarnessError
from harness.io import atomic_path

OWNER = {"kind": "input", "name": "policy"}  # what the built policy's folder is (harness.io.OWNER)

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

SPECIAL = {"pad_token": "<pad>", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
# Chat-format prompts (verl, OpenRLHF) render to exactly the plain prompt text, so every framework sees the same tokens.
CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def train_tokenizer(texts: list[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """BPE over the task text; digits are split one per token (as arithmetic-capable tokenizers do)."""
    tok = Tokenizer(models.BPE(unk_token=SPECIAL["unk_token"]))
    tok.pre_tokenizer = pre_tokenizers.Digits(individual_digits=True)
    tok.decoder = decoders.Fuse()
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL.values())))
    bos = SPECIAL["bos_token"]
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A $B", special_tokens=[(bos, tok.token_to_id(bos))]
    )
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, padding_side="left", **SPECIAL)
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_policy(tokenizer: PreTrainedTokenizerFast, policy: dict, max_positions: int) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=policy["hidden_size"],
        intermediate_size=policy["intermediate_size"],
        num_hidden_layers=policy["num_layers"],
        num_attention_heads=policy["num_heads"],
        num_key_value_heads=policy["num_heads"],
        max_position_embeddings=max_positions,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
    )
    return LlamaForCausalLM(config)


def position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions counted from the first real token, so left padding does not shift them (as in HF generate)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def token_logprobs(model: PreTrainedModel, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """log p(input_ids[:, t] | input_ids[:, :t]) for t >= 1; shape (batch, seq - 1)."""
    logits = model(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids(attention_mask)
    ).logits[:, :-1].float()
    return torch.log_softmax(logits, -1).gather(-1, input_ids[:, 1:, None]).squeeze(-1)


def encode_pairs(tokenizer: PreTrainedTokenizerBase, prompts: list[str],
                 completions: list[str]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Left-padded bos+prompt+completion+eos, and a mask over the completion+eos targets (aligned with
    token_logprobs)."""
    seqs, n_prompt = [], []
    for p, c in zip(prompts, completions):
        ids_p = tokenizer(p)["input_ids"]
        ids_c = tokenizer(c, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        seqs.append(ids_p + ids_c)
        n_prompt.append(len(ids_p))
    width = max(map(len, seqs))
    input_ids = torch.full((len(seqs), width), tokenizer.pad_token_id)
    attention_mask = torch.zeros((len(seqs), width), dtype=torch.long)
    target_mask = torch.zeros((len(seqs), width - 1))
    for i, (s, n_p) in enumerate(zip(seqs, n_prompt)):
        input_ids[i, width - len(s):] = torch.tensor(s)
        attention_mask[i, width - len(s):] = 1
        target_mask[i, width - len(s) + n_p - 1:] = 1
    return input_ids, attention_mask, target_mask


def fit(model: torch.nn.Module, rows: list, *, steps: int, batch_size: int, lr: float, seed: int,
        loss: Callable[[list], torch.Tensor]) -> list[float]:
    """AdamW over `steps` random batches of `rows`, minimising `loss(batch)`; returns the loss per step."""
    rng = random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    losses = []
    for _ in range(steps):
        value = loss(rng.sample(rows, min(batch_size, len(rows))))
        opt.zero_grad()
        value.backward()
        opt.step()
        losses.append(value.item())
    return losses


def supervised_warm_start(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, train_rows: list[dict],
                          sft: dict) -> list[float]:
    """A short SFT phase on the train split (loss on answer tokens only); returns the loss per step."""
    seed_everything(sft["seed"])

    def answer_nll(batch: list[dict]) -> torch.Tensor:
        ids, attn, target = encode_pairs(tokenizer, [r["prompt"] for r in batch], [r["answer"] for r in batch])
        return -(token_logprobs(model, ids, attn) * target).sum() / target.sum()

    return fit(model, train_rows, steps=sft["steps"], batch_size=sft["batch_size"], lr=sft["lr"], seed=sft["seed"],
               loss=answer_nll)


def check_prompt_lengths(tokenizer: PreTrainedTokenizerBase, dataset: dict[str, list[dict]], limit: int) -> None:
    """Stop before any run when prompts are longer than remax.max_prompt_length tokens: each framework would cut or
    drop them its own way, and the runs would no longer see the same prompts."""
    long = [(r["id"], n) for rows in dataset.values() for r in rows
            if (n := len(tokenizer(r["prompt"])["input_ids"])) > limit]
    if long:
        shown = ", ".join(f"{i} ({n} tokens)" for i, n in long[:5]) + (" ..." if len(long) > 5 else "")
        raise HarnessError(f"dataset: {len(long)} prompt(s) longer than remax.max_prompt_length = {limit} tokens "
                           f"with this policy's tokenizer: {shown}; raise remax.max_prompt_length or drop them")


def make_policy(dataset: dict[str, list[dict]], config: dict, dest: str | Path) -> dict:
    """Tokenizer + model + SFT, saved whole to `dest` (atomically). Returns a small record of how it was made."""
    seed_everything(config["policy"]["sft"]["seed"])
    train = dataset["train"]
    start = time.perf_counter()
    tokenizer = train_tokenizer([r["prompt"] + r["answer"] for r in train], config["tokenizer"]["vocab_size"])
    check_prompt_lengths(tokenizer, dataset, config["remax"]["max_prompt_length"])
    longest_prompt = max(len(tokenizer(r["prompt"])["input_ids"]) for split in dataset.values() for r in split)
    max_positions = longest_prompt + config["remax"]["max_response_length"] + 1
    model = build_policy(tokenizer, config["policy"], max_positions)
    losses = supervised_warm_start(model, tokenizer, train, config["policy"]["sft"])
    with atomic_path(dest, owner=OWNER) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
    return {
        "parameters": sum(p.numel() for p in model.parameters()),
        "vocab_size": len(tokenizer),
        "sft_steps": len(losses),
        "sft_loss_first": losses[0] if losses else None,
        "sft_loss_last": losses[-1] if losses else None,
        "seconds": time.perf_counter() - start,
    }


def load_policy(path: str | Path,
                device: str | torch.device = "cpu") -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Any Hugging Face causal LM (the built policy or a checkpoint given by policy.path), ready for batched
    generation: left padding, and a pad token (the EOS token where the checkpoint has none)."""
    path = Path(path)
    if not (path / "config.json").is_file():
        raise HarnessError(f"{path}: not a saved policy (no config.json)")
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(path)
    return model.to(device), tokenizer
