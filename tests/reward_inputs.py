"""Shared inputs whose shared reward is a reward model, for the framework plan tests.

The 8xA100 profile at sizes every adapter accepts (OpenRLHF's micro-batches, DeepSpeed-Chat's 20 batches per
epoch), a tiny built policy, and a tiny one-label LlamaForSequenceClassification checkpoint (random weights: the
plans never score, and the served-path tests compare the server's answers with the same checkpoint's own forward
pass) linked as `reward.path`, built through harness.inputs like the pipeline's inputs rules do.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
from pathlib import Path

import yaml
from conftest import a100x8_offline

from harness.config import CONFIG_ROLE, validate_config
from harness.inputs import build_dataset, build_policy, build_reward
from harness.io import write_text

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def save_reward_model(dest: Path, texts: list[str], max_positions: int = 128) -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForSequenceClassification

    from harness.inputs.policy import train_tokenizer

    tokenizer = train_tokenizer(texts, 64)
    torch.manual_seed(0)
    model = LlamaForSequenceClassification(LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=2, num_labels=1, pad_token_id=tokenizer.pad_token_id,
        max_position_embeddings=max_positions))
    model.save_pretrained(dest)
    tokenizer.save_pretrained(dest)
    return dest


def model_reward_inputs(root: Path) -> dict:
    """{"config", "config_path", "inputs", "checkpoint"} under `root`: dataset, policy and the reward model."""
    from harness.inputs import task

    raw = a100x8_offline(2000, 100)
    raw["policy"] = {"hidden_size": 16, "intermediate_size": 32, "num_layers": 1, "num_heads": 2, "sft": {"steps": 0}}
    raw["remax"].update(train_batch_size=32, max_prompt_length=64, max_response_length=8)
    raw["verl"] = {**raw.get("verl", {}), "micro_batch_size_per_gpu": 4}  # divides each of 8 GPUs' 32 / 8 rows
    checkpoint = root / "reward-ckpt"
    rows = task.generate({**validate_config(raw)["task"], "n_train": 50, "n_eval": 0})
    save_reward_model(checkpoint, [r["prompt"] + r["answer"] for r in rows])
    raw["reward"] = {"kind": "model", "path": str(checkpoint), "device": "cpu", "batch_size": 8}
    config = validate_config(raw)
    config_path = root / "config.yaml"
    write_text(config_path, yaml.safe_dump(config), role=CONFIG_ROLE)
    inputs = root / "inputs"
    build_dataset(config, inputs)
    build_policy(config, inputs)
    build_reward(config, inputs)
    return {"config": config, "config_path": config_path, "inputs": inputs, "checkpoint": checkpoint}


@contextlib.contextmanager
def reward_server(inputs: Path):
    """`remax-bench serve-reward --inputs INPUTS` on a free loopback port, as launch.sh starts it; yields its URL."""
    from harness.reward.server import wait_healthy

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([str(BIN / "remax-bench"), "serve-reward", "--host", "127.0.0.1", "--port", str(port),
                             "--inputs", str(inputs), "--device", "cpu", "--batch-size", "8"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        try:
            wait_healthy(url, 120)
        except Exception:
            proc.kill()
            raise AssertionError(f"reward server did not start: {proc.communicate()[0][-3000:]}") from None
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def direct_scores(inputs: Path, prompts: list[str], responses: list[str]) -> list[float]:
    """The reward model's own scores, in this process (harness.reward.shared), to compare served answers with."""
    from harness.inputs import resolve_reward
    from harness.reward.shared import load_shared_reward

    return load_shared_reward(resolve_reward(inputs), device="cpu").score(prompts, responses, [""] * len(prompts))
