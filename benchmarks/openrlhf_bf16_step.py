"""Measurement: how far one optimizer step moves the weights OpenRLHF trains with, against fp32 AdamW.

    .venvs/openrlhf-cpu/bin/python benchmarks/openrlhf_bf16_step.py results/inputs/policy

OpenRLHF 0.11.2 trains in bf16 or fp16 only (`--ds.param_dtype`). At ZeRO 0 DeepSpeed wraps the bf16 model in its
FP16_Optimizer over FusedAdam, with fp32 master weights; the model the forward pass uses (and the rollout engine
receives) is the bf16 copy. This builds that engine from OpenRLHF's own DeepSpeed config (`get_train_ds_config`)
on the shared policy, takes three steps on one fixed batch beside torch's fp32 AdamW with the same settings, and
prints per weight the mean |change| of the weights each forward pass sees. Run in the openrlhf-cpu environment
(DS_ACCELERATOR=cpu is set here); about 30 s on 2 cores.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29533")
os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")

import deepspeed
import torch
from openrlhf.utils.deepspeed.deepspeed_utils import get_train_ds_config
from transformers import AutoModelForCausalLM

LR, BETAS, EPS = 1e-3, (0.9, 0.999), 1e-8  # the cpu-frameworks profile's AdamW, weight decay left out


def main(policy: str) -> None:
    fp32 = AutoModelForCausalLM.from_pretrained(policy, dtype=torch.float32)
    bf16 = AutoModelForCausalLM.from_pretrained(policy, dtype=torch.bfloat16)
    config = get_train_ds_config(offload=False, adam_offload=False, stage=0, param_dtype="bf16", max_norm=1.0)
    config.update(optimizer={"type": "AdamW", "params": {"lr": LR, "betas": list(BETAS), "eps": EPS,
                                                         "weight_decay": 0.0}},
                  train_micro_batch_size_per_gpu=4, train_batch_size=4, gradient_accumulation_steps=1)
    engine, optimizer, _, _ = deepspeed.initialize(model=bf16, model_parameters=list(bf16.parameters()),
                                                   config=config)
    print(f"DeepSpeed optimizer: {type(optimizer).__name__} over {type(optimizer.optimizer).__name__}")
    adamw = torch.optim.AdamW(fp32.parameters(), lr=LR, betas=BETAS, eps=EPS, weight_decay=0.0)
    batch = torch.randint(3, fp32.config.vocab_size, (4, 10), generator=torch.Generator().manual_seed(0))
    print("step | weight | fp32 AdamW mean |dw| | DeepSpeed bf16 weights mean |dw| | ratio")
    for step in (1, 2, 3):
        before32 = {n: p.detach().clone() for n, p in fp32.named_parameters()}
        before16 = {n: p.detach().float().clone() for n, p in engine.module.named_parameters()}
        fp32(input_ids=batch, labels=batch).loss.backward()
        adamw.step()
        adamw.zero_grad()
        engine.backward(engine(input_ids=batch, labels=batch).loss)
        engine.step()
        moved16 = dict(engine.module.named_parameters())
        for name, p in fp32.named_parameters():
            d32 = (p.detach() - before32[name]).abs().mean().item()
            d16 = (moved16[name].detach().float() - before16[name]).abs().mean().item()
            print(f"{step} | {name} | {d32:.2e} | {d16:.2e} | {d16 / d32:.2f}")


if __name__ == "__main__":
    main(sys.argv[1])
