"""A learned reward model as the shared reward: check a checkpoint, and score with it.

The format is the one verl's reward worker and OpenRLHF load: a Hugging Face sequence-classification checkpoint
with one label (the reward), scored on prompt + response rendered with the model's chat template where it has one
(`render`). Training a tiny one on the CPU is the inputs stage's (harness/inputs/reward_model.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

from harness import HarnessError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

def check_checkpoint(path: str | Path) -> dict:
    """Raise HarnessError naming `path` unless it is a one-label sequence-classification checkpoint whose tokenizer
    fits its embeddings; return what it is (architecture, vocabulary size)."""
    path = Path(path)
    if not (path / "config.json").is_file():
        raise HarnessError(f"reward model {path}: not a Hugging Face checkpoint directory (no config.json)")
    try:
        cfg = AutoConfig.from_pretrained(path)
    except (OSError, ValueError) as e:
        raise HarnessError(f"reward model {path}: config.json cannot be read ({e})") from None
    archs = list(getattr(cfg, "architectures", None) or [])
    if not any(a.endswith("ForSequenceClassification") for a in archs):
        raise HarnessError(f"reward model {path}: architectures {archs or 'unset'} in config.json; a reward model "
                           "must be a *ForSequenceClassification checkpoint (the format verl and OpenRLHF load)")
    if cfg.num_labels != 1:
        raise HarnessError(f"reward model {path}: {cfg.num_labels} labels; a reward model has exactly one (the score)")
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError, TypeError) as e:
        raise HarnessError(f"reward model {path}: no usable tokenizer in the checkpoint ({e})") from None
    vocab = getattr(cfg, "vocab_size", None)
    if vocab is not None and len(tokenizer) > vocab:
        raise HarnessError(f"reward model {path}: the tokenizer does not match the model: it has {len(tokenizer)} "
                           f"tokens, the model's embedding only {vocab}")
    return {"architecture": archs[0], "vocab_size": vocab, "tokenizer_size": len(tokenizer)}


def _device(requested: str) -> torch.device:
    if requested == "cuda" and not torch.cuda.is_available():
        raise HarnessError("config: at reward.device: 'cuda' requested but no CUDA device is available")
    return torch.device("cuda" if requested != "cpu" and torch.cuda.is_available() else "cpu")


def render(tokenizer: PreTrainedTokenizerBase, prompt: str, response: str) -> str:
    if tokenizer.chat_template:
        return tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}, {"role": "assistant", "content": response}], tokenize=False)
    return prompt + response


class RewardModel:
    """A loaded reward model; `score` is one forward pass per `batch_size` texts. Holds the model, so a class."""

    def __init__(self, path: str | Path, *, device: str = "auto", batch_size: int = 64,
                 max_length: int = 1024) -> None:
        check_checkpoint(path)
        self.device = _device(device)
        self.batch_size, self.max_length = batch_size, max_length
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        # The score sits at the last real token: pad on the left, and cut long texts from the left too, so the
        # response's end is always scored.
        self.tokenizer.padding_side = self.tokenizer.truncation_side = "left"
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        self.model = AutoModelForSequenceClassification.from_pretrained(path, dtype=dtype).to(self.device).eval()
        if self.model.config.pad_token_id is None:
            self.model.config.pad_token_id = self.tokenizer.pad_token_id

    def score(self, prompts: Sequence[str], responses: Sequence[str], answers: Sequence[str] | None = None
              ) -> list[float]:
        texts = [render(self.tokenizer, p, r) for p, r in zip(prompts, responses)]
        out: list[float] = []
        for i in range(0, len(texts), self.batch_size):
            enc = self.tokenizer(texts[i:i + self.batch_size], padding=True, truncation=True,
                                 max_length=self.max_length, return_tensors="pt").to(self.device)
            with torch.inference_mode():
                out.extend(self.model(**enc).logits[:, 0].float().tolist())
        return out
