"""A Hugging Face checkpoint's config.json, read once for every reader of a model's shape (the MFU's FLOPs, the
preflight's head size, DeepSpeed-Chat's copy of it, OpenRLHF's max_len, vLLM's CPU head sizes): through the one
bounded loader, with the fields each asks for checked to be what a model's shape is made of."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from harness import HarnessError
from harness.io import read_json_object

CONFIG = "config.json"


def _positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def checkpoint_config(checkpoint: str | os.PathLike, what: str = "checkpoint config", *,
                      required: Iterable[str] = (), optional: Iterable[str] = ()) -> dict:
    """The JSON object in CHECKPOINT/config.json, every field in `required` a whole number above 0, and every field
    in `optional` that or absent (or null, as Hugging Face writes an unset head_dim); HarnessError naming the file and
    the field otherwise."""
    path = Path(checkpoint) / CONFIG
    config = read_json_object(path, what)
    for key in required:
        if not _positive_int(config.get(key)):
            got = "missing" if key not in config else f"{config[key]!r}"
            raise HarnessError(f"{path}: {key} should be a whole number above 0, not {got}"[:500])
    for key in optional:
        if config.get(key) is not None and not _positive_int(config[key]):
            raise HarnessError(f"{path}: {key} should be a whole number above 0 (or absent), not {config[key]!r}"[:500])
    return config


HEAD_FIELDS = ("hidden_size", "num_attention_heads", "head_dim")


def head_dim(config: dict) -> int | None:
    """The attention head size of a config read with HEAD_FIELDS optional: head_dim, else hidden_size /
    num_attention_heads; None where neither is given."""
    if config.get("head_dim"):
        return config["head_dim"]
    if config.get("hidden_size") and config.get("num_attention_heads"):
        return config["hidden_size"] // config["num_attention_heads"]
    return None
