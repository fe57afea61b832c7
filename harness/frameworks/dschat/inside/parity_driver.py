"""Runs in DeepSpeed-Chat's environment: ONE update of the official ReMax code on the parity batch (harness.parity).

    python parity_driver.py --batch DIR --out FILE --checkout CHECKOUT --ref REF_DIR --accelerator cpu|cuda
        main.py's own arguments...

main.py's arguments are the planned ones (harness.frameworks.dschat.parity builds them with plan.build_argv), read by
main.py's own `parse_args`; the actor path among them and REF_DIR are the batch's actor/ and ref/ laid out as the
plan lays out a run's actor (config.json naming the directory, which utils/utils.py load_hf_tokenizer needs).

What runs is main.py's step-3 loop body, one iteration, with the checkout's own classes and functions:
DeepSpeedRLHFEngine (rlhf_engine.py: ds config from utils/ds_utils.py get_train_ds_config, the optimizer and
scheduler, deepspeed.initialize -> DeepSpeedHybridEngine with ZeRO), DeepSpeedReMaxTrainer.generate_experience
(_generate_sequence with its short-response rewrite, the action mask, the actor's and reference's log-probs),
MiniDataset, gradient_checkpointing_enable, compute_loss (compute_returns: KL in the return, reward clip, gamma;
gather_log_probs; actor_loss_fn), actor.backward(loss / len(exp_dataset)) and actor.step() (ZeRO's clip and the
optimizer). The checkout's pinned code has no train_rlhf: main.py calls compute_loss, backward and step itself.
On the cpu accelerator the launcher's CPU layer (launcher.install_cpu_layer) is installed first, as in a CPU run:
FusedAdam -> torch AdamW with the same arguments, .cuda() -> the CPU, Transformers 5's module moves.

Replaced, each at the narrowest seam:
- generation: the actor's HF `generate` (called by _generate_sequence) returns the batch's prompt + response, the
  response padded after its EOS with the pad id generate() is given, as generate() pads; _generate_sequence's own
  rewrite of responses of at most one non-pad token still runs (the count of rows it rewrote is in settings). The
  greedy call returns the same sequence: only its reward is used, and that is replaced too.
- the reward engine (`DeepSpeedRLHFEngine._init_reward`, as the launcher replaces it): forward_value returns the
  batch's scores for the sampled sequence and its baselines for the greedy one.
- the reference model's path (`DeepSpeedRLHFEngine._init_ref` builds it from the actor's path, the initial
  policy): the batch's ref/, since the batch's actor has moved off the initial policy.
- the prompts: the batch's prompt tokens (its attention mask) through the checkout's DataCollatorRLHF, as main.py's
  dataloader delivers them (flipped, left-padded with the tokenizer's pad id to --max_prompt_seq_len).
- the process group: one rank, as `deepspeed --num_gpus 1` starts it (env vars; --local_rank=0 as it passes).
"""

from __future__ import annotations

import argparse
import functools
import os
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.parity import grad_norm_hook

HERE = Path(__file__).resolve().parent
OWN_OPTIONS = ("--batch", "--out", "--checkout", "--ref", "--accelerator")


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    p = argparse.ArgumentParser(prog="parity_driver", allow_abbrev=False)
    p.add_argument("--batch", required=True, type=Path)
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--checkout", required=True, help="the pinned ReMax checkout")
    p.add_argument("--ref", required=True, help="the KL anchor, laid out as the plan lays out an actor")
    p.add_argument("--accelerator", choices=("cpu", "cuda"), default="cpu", help="DS_ACCELERATOR, as launch.sh sets")
    return p.parse_known_args(argv)


def setup(checkout: str, accelerator: str) -> None:
    """The process a planned run has when main.py starts: DeepSpeed's accelerator, one rank, the checkout importable,
    and on the CPU the launcher's CPU layer."""
    os.environ["DS_ACCELERATOR"] = accelerator
    # launch.sh gives each environment its own cache of DeepSpeed's JIT-built ops (container.env_check)
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", os.path.join(sys.prefix, "torch_extensions"))
    with socket.socket() as s:  # a free port: parity may run beside a planned run on dschat.master_port
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1"),
                       ("MASTER_PORT", str(port))):
        os.environ.setdefault(key, value)
    sys.path.insert(0, str(HERE))
    import launcher  # type: ignore[import-not-found]

    launcher.prepare(os.path.join(checkout, "step3_rlhf_finetuning", "main.py"))
    if accelerator == "cpu":
        launcher.install_cpu_layer()


def trace(calls: list[str]) -> None:
    """Record, in order of first call, the framework functions the update goes through (the output's `calls`)."""
    import deepspeed.runtime.engine
    import deepspeed.runtime.hybrid_engine
    import deepspeed.runtime.zero.stage_1_and_2
    import remax_trainer
    import rlhf_engine
    import utils.data.data_utils

    targets = [
        (rlhf_engine.DeepSpeedRLHFEngine, "_init_actor", "rlhf_engine.DeepSpeedRLHFEngine._init_actor"),
        (rlhf_engine.DeepSpeedRLHFEngine, "_init_ref", "rlhf_engine.DeepSpeedRLHFEngine._init_ref"),
        (rlhf_engine, "get_train_ds_config", "utils.ds_utils.get_train_ds_config"),
        (utils.data.data_utils.DataCollatorRLHF, "__call__", "utils.data.data_utils.DataCollatorRLHF.__call__"),
        *((remax_trainer.DeepSpeedReMaxTrainer, name, f"remax_trainer.DeepSpeedReMaxTrainer.{name}")
          for name in ("generate_experience", "_generate_sequence", "compute_loss", "compute_returns",
                       "actor_loss_fn")),
        (remax_trainer, "gather_log_probs", "remax_trainer.gather_log_probs"),
        (utils.data.data_utils.MiniDataset, "add", "utils.data.data_utils.MiniDataset.add"),
        (deepspeed.runtime.engine.DeepSpeedEngine, "backward", "deepspeed.runtime.engine.DeepSpeedEngine.backward"),
        (deepspeed.runtime.hybrid_engine.DeepSpeedHybridEngine, "step",
         "deepspeed.runtime.hybrid_engine.DeepSpeedHybridEngine.step"),
        (deepspeed.runtime.zero.stage_1_and_2.DeepSpeedZeroOptimizer, "step",
         "deepspeed.runtime.zero.stage_1_and_2.DeepSpeedZeroOptimizer.step"),
    ]
    for owner, attr, name in targets:
        setattr(owner, attr, _recorded(getattr(owner, attr), name, calls))


def _recorded(fn: Callable, name: str, calls: list[str]) -> Callable:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if name not in calls:
            calls.append(name)
        return fn(*args, **kwargs)
    return wrapper


class BatchReward:
    """DeepSpeed-Chat's reward engine's interface (forward_value(...)['chosen_end_scores'], eval/train), answering
    with the batch's scores, then its baselines: generate_experience scores the sampled sequence first."""

    def __init__(self, scores: Any, baselines: Any) -> None:
        self.queue = [scores, baselines]

    def forward_value(self, seq: Any, action_mask: Any, prompt_length: int) -> dict:
        return {"chosen_end_scores": self.queue.pop(0).to(seq.device)}

    def eval(self) -> None:
        pass

    def train(self, mode: bool = True) -> None:
        pass


def build(opts: argparse.Namespace, main_argv: list[str], batch: dict) -> tuple[Any, Any, Any, Any]:
    """main.main() up to the trainer, for one rank without unsupervised data: (args, engine, trainer, tokenizer)."""
    import deepspeed
    import main as remax_main  # type: ignore[import-not-found]  # step3_rlhf_finetuning/main.py: its parse_args
    import rlhf_engine
    import torch
    from remax_trainer import DeepSpeedReMaxTrainer
    from utils.utils import load_hf_tokenizer, set_random_seed

    sys.argv = [remax_main.__file__, *main_argv, "--local_rank=0"]  # the deepspeed launcher adds --local_rank
    args = remax_main.parse_args()
    assert args.gradient_accumulation_steps == 1
    deepspeed.init_distributed()
    args.global_rank = torch.distributed.get_rank()
    args.gradient_accumulation_steps_actor = args.gradient_accumulation_steps
    set_random_seed(args.seed)
    tokenizer = load_hf_tokenizer(args.actor_model_name_or_path, fast_tokenizer=True)
    reward = BatchReward(batch["scores"], batch["baselines"])
    init_ref = rlhf_engine.DeepSpeedRLHFEngine._init_ref
    rlhf_engine.DeepSpeedRLHFEngine._init_reward = lambda self, reward_model_name_or_path: reward
    rlhf_engine.DeepSpeedRLHFEngine._init_ref = (
        lambda self, actor_model_name_or_path: init_ref(self, actor_model_name_or_path=opts.ref))
    # num_total_iters only shapes the LR schedule; the plan's is constant without warm-up
    engine = rlhf_engine.DeepSpeedRLHFEngine(
        actor_model_name_or_path=args.actor_model_name_or_path,
        reward_model_name_or_path=args.reward_model_name_or_path, tokenizer=tokenizer, num_total_iters=1, args=args)
    args.end_of_conversation_token = tokenizer.eos_token
    return args, engine, DeepSpeedReMaxTrainer(engine, args), tokenizer


def experience(args: Any, engine: Any, trainer: Any, tokenizer: Any, batch: dict) -> tuple[dict, int]:
    """generate_experience on the batch's prompts and responses; and how many responses its rewrite changed."""
    import torch
    from utils.data.data_utils import DataCollatorRLHF

    # The prompts as main.py's dataloader delivers them: PromptDataset keeps each prompt's tokens flipped.
    width = batch["prompt_length"]
    rows = [(ids[m.bool()].flip(0), torch.ones(int(m.sum()), dtype=torch.long).flip(0), tokenizer.pad_token_id)
            for ids, m in zip(batch["input_ids"][:, :width], batch["attention_mask"][:, :width])]
    collated = DataCollatorRLHF(args.max_prompt_seq_len, args.inference_tp_size)(rows)
    prompt = {k: v.to(torch.device(engine.actor.device)) for k, v in collated.items()}
    sampled: dict = {}

    def generate(prompts: torch.Tensor, attention_mask: torch.Tensor | None = None, max_length: int = 0,
                 pad_token_id: int | None = None, **kwargs: Any) -> torch.Tensor:
        assert torch.equal(prompts, prompt["prompt"]), "generate() got other prompts than the collated batch"
        response = torch.where(batch["response_mask"].bool(), batch["input_ids"][:, width:], int(pad_token_id or 0))
        assert prompts.shape[1] + response.shape[1] <= max_length
        seq = torch.cat([prompts, response.to(prompts)], 1)
        sampled.setdefault("seq", seq.clone())
        return seq

    engine.actor.module.generate = generate
    exp = trainer.generate_experience(prompt["prompt"], prompt["prompt_att_mask"], 0, print_answers=False)
    return exp, int((exp["input_ids"] != sampled["seq"]).any(1).sum())


def train(args: Any, engine: Any, trainer: Any, exp: dict) -> dict:
    """main.py's training part of the iteration: loss, returns, the applied gradient's norm, the precision."""
    import torch
    from utils.data.data_utils import MiniDataset

    actor = engine.actor
    record: dict = {}
    grad_norm_hook(actor.optimizer.optimizer, record)  # the basic optimizer inside ZeRO's
    exp_dataset = MiniDataset(args.generation_batches, args.per_device_training_batch_size).add(exp)
    assert exp_dataset is not None
    if args.actor_gradient_checkpointing:
        actor.gradient_checkpointing_enable()
    loss, returns = 0.0, []
    for exp_data in exp_dataset:
        actor_loss, actor_return, _ = trainer.compute_loss(exp_data)
        actor.backward(actor_loss / len(exp_dataset))
        loss += float(actor_loss) / len(exp_dataset)
        returns.append(actor_return)
    precision = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}[
        next(actor.module.parameters()).dtype]
    actor.step()
    return {"loss": loss, "returns": torch.cat(returns), "applied_grad_norm": record["applied_grad_norm"],
            "precision": precision, "micro_batches": len(exp_dataset)}


def settings(args: Any, engine: Any, trainer: Any, tokenizer: Any, trained: dict) -> dict:
    """The settings that decide the update, as the framework holds them after parsing and building."""
    actor = engine.actor
    basic = actor.optimizer.optimizer
    group = basic.param_groups[0]
    return {
        "optimizer": f"{type(basic).__module__}.{type(basic).__qualname__}",
        "ds_optimizer": f"{type(actor.optimizer).__module__}.{type(actor.optimizer).__qualname__}",
        "param_groups": len(basic.param_groups),
        "lr": group["lr"], "betas": list(group["betas"]), "eps": group["eps"], "weight_decay": group["weight_decay"],
        "loss": "sum(-returns * logp * mask) / mask.sum() per micro-batch (token mean), "
                "/ len(exp_dataset) micro-batches (remax_trainer.py actor_loss_fn, main.py)",
        "micro_batches": trained["micro_batches"],
        "grad_clip": actor.gradient_clipping(),  # the ds config's gradient_clipping
        "kl": f"in the return at each token only (compute_returns), k1 -(logp - ref_logp), "
              f"coefficient {trainer.kl_ctl}",
        "kl_coef": trainer.kl_ctl,
        "reward_clip": trainer.clip_reward_value,
        "gamma": trainer.gamma,
        "zero_stage": actor.zero_optimization_stage(),
        "bf16": actor.bfloat16_enabled(),
        "gradient_checkpointing": bool(args.actor_gradient_checkpointing),
        "dropout_disabled": bool(args.disable_actor_dropout),
        "engine": type(actor).__name__,
        "prompt_width": trainer.prompt_length,
        "pad_token_id": tokenizer.pad_token_id, "eos_token_id": tokenizer.eos_token_id,
    }


def update(opts: argparse.Namespace, main_argv: list[str]) -> dict:
    import deepspeed
    import torch

    calls: list[str] = []
    trace(calls)
    batch = torch.load(opts.batch / "batch.pt", weights_only=True)
    args, engine, trainer, tokenizer = build(opts, main_argv, batch)
    # ZeRO's fp32 master copy, which the optimizer steps: it starts from the weights rounded to bf16 as loaded, so the
    # update is measured from there (the bf16 copy the model runs in rounds the update itself, ~lr at |w| ~ 0.1)
    params = list(engine.actor.module.named_parameters())
    before = {n: deepspeed.utils.safe_get_full_fp32_param(p).float().cpu().clone() for n, p in params}
    exp, rewritten = experience(args, engine, trainer, tokenizer, batch)
    trained = train(args, engine, trainer, exp)
    start, mask = trainer.prompt_length - 1, batch["response_mask"].float()
    t = mask.shape[1]
    action_mask = exp["attention_mask"][:, trainer.prompt_length:][:, :t].float().cpu()
    return {
        "logprobs": exp["logprobs"][:, start:start + t].float().cpu() * mask,
        "ref_logprobs": exp["ref_logprobs"][:, start:start + t].float().cpu() * mask,
        "advantages": trained["returns"][:, :t].float().cpu() * mask,
        "loss": trained["loss"],
        "grad_norm": float(engine.actor.get_global_grad_norm()),
        "applied_grad_norm": trained["applied_grad_norm"],
        "weights": {n: deepspeed.utils.safe_get_full_fp32_param(p).float().cpu().clone() for n, p in params},
        "weights_before": before,
        "weights_bf16": {n: p.detach().float().cpu().clone() for n, p in params},  # the copy the model runs in
        "precision": trained["precision"],
        "calls": calls,
        "settings": {**settings(args, engine, trainer, tokenizer, trained), "short_responses_rewritten": rewritten,
                     "action_mask_vs_response_mask_mismatches": int((action_mask != mask).sum())},
    }


def main(argv: list[str] | None = None) -> None:
    opts, main_argv = parse_args(sys.argv[1:] if argv is None else argv)
    t0 = time.perf_counter()
    setup(opts.checkout, opts.accelerator)
    import torch

    out = update(opts, main_argv)
    out["settings"]["driver_wall_s"] = time.perf_counter() - t0
    tmp = opts.out.with_name(opts.out.name + ".tmp")
    torch.save(out, tmp)
    os.replace(tmp, opts.out)
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
