"""Runs in the TRL environment: one ReMax update of the harness's TRL trainer on harness.parity's fixed batch, made
by TRL's own training loop, written in harness.parity's form.

`python parity_driver.py --batch DIR --out FILE [--trainer PATH] [remax_trl.py's arguments]` (harness.frameworks.trl
.parity passes the arguments plan.trainer_settings gives a run, on the batch's settings). The trainer is
remax_trl.build_trainer's, from those arguments, with the actor DIR/actor as its policy; `trainer.train()` runs for
max_steps 1: Transformers' Trainer._inner_training_loop, RLOOTrainer._prepare_inputs, remax_trl's
_generate_and_score_completions (TRL's _get_per_token_logps_and_entropies for the actor's and the reference's
log-probs, remax_advantages for the KL in the reward and the advantage), remax_trl's _compute_loss, Accelerate's
backward, Trainer._clip_grad_norm (Accelerator.clip_grad_norm_ at max_grad_norm) and the AdamW step Transformers
built. `--trainer`: another remax_trl.py (a copy with a planted fault; it must lie 4+ folders deep, as the real one
does, for its sys.path line).

Replaced, at the narrowest seams, because they are not the update or cannot give the batch's rows:
- generation: RLOOTrainer._generate_single_turn (the Transformers generate call; TRL's own _generate still tokenizes
  the prompts, decodes, counts) returns the batch's responses for the prompts TRL tokenized (found by their tokens,
  so TRL's tokenization must give the batch's prompt), and a one-token placeholder for the greedy call (the batch
  holds the greedy responses' rewards, not their tokens);
- the reward: the trainer's reward function (remax_trl.Scorer) is replaced by one returning the batch's scores for
  the sampled responses and its baselines for the greedy call (told apart by the completion lists passed through);
- the reference (KL anchor): TRL builds it from the policy's path (the actor's here); its weights are replaced by
  DIR/ref's before training (in a run both are the initial policy);
- the dataset: a file of the batch's prompts and answers, so the one step's 128 prompts are the batch's (TRL's sampler
  still orders them; the outputs are put back in the batch's row order);
- remax_trl's argument --steps: 1.
Observed, not changed: remax_advantages is wrapped to keep the log-probs, reference log-probs and advantages it gets
and returns; a TrainerCallback keeps the loss and grad_norm Trainer logs; harness.parity.grad_norm_hook on the torch
optimizer gives the applied gradient's norm; sys.setprofile names the framework functions that ran.
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import json
import sys
import tempfile
from pathlib import Path
from types import MethodType, ModuleType
from typing import Any

import torch

from harness.parity import ACTOR, REF, grad_norm_hook, read_batch, save_update

TRAINER = Path(__file__).resolve().with_name("remax_trl.py")


def load_trainer(path: Path) -> ModuleType:
    """remax_trl (or a copy of it) by path, under its own module name, as a run runs it."""
    spec = importlib.util.spec_from_file_location("remax_trl", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["remax_trl"] = module
    spec.loader.exec_module(module)
    return module


def fixed_rollout(trainer: Any, batch: dict) -> dict:
    """Put the batch's responses and rewards in place of generation and scoring (module docstring); the returned dict
    gets 'order' (the batch row of each of TRL's rows) once TRL has generated."""
    width, eos = batch["prompt_length"], trainer.eos_token_ids[0]
    rows: dict[tuple, list[int]] = {}
    for i, (ids, keep) in enumerate(zip(batch["input_ids"][:, :width].tolist(),
                                        batch["attention_mask"][:, :width].tolist())):
        rows.setdefault(tuple(t for t, k in zip(ids, keep) if k), []).append(i)
    lengths = batch["response_mask"].sum(-1).long().tolist()
    responses = [r[:k] for r, k in zip(batch["input_ids"][:, width:].tolist(), lengths)]
    state: dict = {}

    def _generate_single_turn(self: Any, prompt_ids: list, images: Any, multimodal_fields: Any) -> list:
        free = {k: list(v) for k, v in rows.items()}
        try:
            order = [free[tuple(p)].pop(0) for p in prompt_ids]
        except (KeyError, IndexError):
            raise RuntimeError("TRL's tokenization of a prompt is none of the batch's prompt tokens") from None
        if self.generation_config.do_sample:
            state["order"], state["sampled"] = order, [list(responses[i]) for i in order]
            return state["sampled"]
        if order != state.get("order"):
            raise RuntimeError("the greedy call's prompts are not the sampled call's")
        state["greedy"] = [[eos] for _ in order]
        return state["greedy"]

    def reward(prompts: list, completions: list, completion_ids: list, **_: Any) -> list[float]:
        if completion_ids is state.get("sampled"):
            return [float(batch["scores"][i]) for i in state["order"]]
        if completion_ids is state.get("greedy"):
            return [float(batch["baselines"][i]) for i in state["order"]]
        raise RuntimeError("the reward function got completions neither generation call returned")

    reward.__name__ = trainer.reward_func_names[0]
    trainer._generate_single_turn = MethodType(_generate_single_turn, trainer)
    assert len(trainer.reward_funcs) == 1  # remax_trl's one Scorer
    trainer.reward_funcs[0] = reward
    return state


def load_reference(trainer: Any, ref_dir: Path) -> None:
    """DIR/ref's weights into the reference model TRL built (from the actor's path: module docstring)."""
    from transformers import AutoModelForCausalLM

    ref = AutoModelForCausalLM.from_pretrained(ref_dir, dtype=trainer.ref_model.dtype)
    trainer.ref_model.load_state_dict(ref.state_dict())


def observed_calls(module: ModuleType) -> dict:
    """The code objects of the framework functions an update goes through, by dotted name."""
    import accelerate  # type: ignore[import-not-found]
    import accelerate.optimizer  # type: ignore[import-not-found]
    import transformers
    from trl.trainer.rloo_trainer import RLOOTrainer  # type: ignore[import-not-found]

    from_module = module.__name__
    funcs = {
        "transformers.Trainer.train": transformers.Trainer.train,
        "transformers.Trainer._inner_training_loop": transformers.Trainer._inner_training_loop,
        "trl.RLOOTrainer.training_step": RLOOTrainer.training_step,
        "transformers.Trainer.training_step": transformers.Trainer.training_step,
        "trl.RLOOTrainer._prepare_inputs": RLOOTrainer._prepare_inputs,
        f"{from_module}.ReMaxTrainer._generate_and_score_completions":
            module.ReMaxTrainer._generate_and_score_completions,
        "trl.RLOOTrainer._generate": RLOOTrainer._generate,
        f"{from_module}.ReMaxTrainer._greedy": module.ReMaxTrainer._greedy,
        "trl.RLOOTrainer._calculate_rewards": RLOOTrainer._calculate_rewards,
        "trl.RLOOTrainer._get_per_token_logps_and_entropies": RLOOTrainer._get_per_token_logps_and_entropies,
        f"{from_module}.remax_advantages": module.remax_advantages,
        "trl.RLOOTrainer.compute_loss": RLOOTrainer.compute_loss,
        f"{from_module}.ReMaxTrainer._compute_loss": module.ReMaxTrainer._compute_loss,
        "accelerate.Accelerator.backward": accelerate.Accelerator.backward,
        "transformers.Trainer._clip_grad_norm": transformers.Trainer._clip_grad_norm,
        "accelerate.Accelerator.clip_grad_norm_": accelerate.Accelerator.clip_grad_norm_,
        "accelerate.Accelerator._clip_grad_norm_dtensor_aware": accelerate.Accelerator._clip_grad_norm_dtensor_aware,
        "torch.nn.utils.get_total_norm": torch.nn.utils.get_total_norm,
        "torch.nn.utils.clip_grads_with_norm_": torch.nn.utils.clip_grads_with_norm_,
        "accelerate.optimizer.AcceleratedOptimizer.step": accelerate.optimizer.AcceleratedOptimizer.step,
        "torch.optim.AdamW.step": torch.optim.AdamW.step,
    }
    return {inspect.unwrap(f).__code__: name for name, f in funcs.items()}


def name(option: Any) -> str:
    """A TrainingArguments option as written in a config (its enum's value)."""
    return str(getattr(option, "value", option))


def record_advantages(module: ModuleType, record: dict) -> None:
    """Wrap remax_advantages to keep the log-probs, reference log-probs and advantages it gets and returns."""
    recorded_advantages = module.remax_advantages

    def remax_advantages(scores: Any, baselines: Any, logps: Any, ref_logps: Any, mask: Any, kl_coef: float) -> Any:
        out = recorded_advantages(scores, baselines, logps, ref_logps, mask, kl_coef)
        record.update(logprobs=logps * mask, ref_logprobs=ref_logps * mask, advantages=out)
        return out

    module.remax_advantages = remax_advantages  # type: ignore[attr-defined]  # _generate_and_score_completions looks it up in the module


def observer(record: dict) -> Any:
    """A TrainerCallback that keeps the torch optimizer (with the applied-gradient hook on it) and the loss and
    grad_norm Trainer logs."""
    from transformers import TrainerCallback

    class Observer(TrainerCallback):
        def on_train_begin(self, args: Any, state: Any, control: Any, optimizer: Any = None, **kw: Any) -> None:
            record["optimizer"] = optimizer.optimizer  # the torch optimizer inside Accelerate's wrapper
            grad_norm_hook(record["optimizer"], record)

        def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None, **kw: Any) -> None:
            if logs and "grad_norm" in logs:
                record.update(loss=float(logs["loss"]), grad_norm=float(logs["grad_norm"]))

    return Observer()


def train_one_step(module: ModuleType, batch_dir: Path, theirs: list[str], batch: dict,
                   callback: Any) -> tuple[Any, dict, list[str]]:
    """remax_trl's trainer for the run's arguments on the batch's prompts, with the batch's rollout and reference,
    trained for its one step: the trainer, the rollout's state and the framework functions that ran, in order."""
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "dataset.jsonl"
        data.write_text("".join(json.dumps({"split": "train", "prompt": q, "answer": a}) + "\n"
                                for q, a in zip(batch["prompts"], batch["answers"])))
        args = module.parse_args(["--policy", str(batch_dir / ACTOR), "--dataset", str(data),
                                  "--output-dir", f"{tmp}/output", "--steps-log", f"{tmp}/steps.jsonl",
                                  "--eval-log", f"{tmp}/eval.json", *theirs])
        args.steps = 1
        trainer = module.build_trainer(args)
        trainer.add_callback(callback)
        load_reference(trainer, batch_dir / REF)
        state = fixed_rollout(trainer, batch)
        targets, calls = observed_calls(module), []

        def profile(frame: Any, event: str, arg: Any) -> None:
            if event == "call" and frame.f_code in targets and targets[frame.f_code] not in calls:
                calls.append(targets[frame.f_code])

        sys.setprofile(profile)
        try:
            trainer.train()
        finally:
            sys.setprofile(None)
    return trainer, state, calls


def in_batch_order(record: dict, state: dict, mask: torch.Tensor) -> dict:
    """The recorded log-probs, reference log-probs and advantages as the batch's (rows, T), rows in its order."""
    rows, width = mask.shape
    if sorted(state["order"]) != list(range(rows)):
        raise RuntimeError(f"the step took {len(state['order'])} of the batch's {rows} rows, not each once "
                           "(remax_trl's --per-device-batch is not the batch)")
    out: dict = {}
    for key in ("logprobs", "ref_logprobs", "advantages"):
        theirs_t = record[key].detach().float()
        if theirs_t.shape[1] > width:
            raise RuntimeError(f"TRL's completions are {theirs_t.shape[1]} tokens wide, the batch's {width}")
        full = torch.zeros(rows, width)
        full[state["order"], :theirs_t.shape[1]] = theirs_t
        out[key] = full * mask
    return out


def collect_output(module: ModuleType, trainer: Any, record: dict, state: dict, calls: list[str],
                   batch: dict) -> dict:
    """The update in harness.parity's form, with the settings as the trainer holds them after the step."""
    out = in_batch_order(record, state, batch["response_mask"])
    model = trainer.accelerator.unwrap_model(trainer.model)
    dtype = next(model.parameters()).dtype
    bf16 = trainer.accelerator.mixed_precision == "bf16" or dtype == torch.bfloat16
    opt, targs = record["optimizer"], trainer.args
    groups = opt.param_groups
    loss_source = inspect.getsource(module.ReMaxTrainer._compute_loss).strip().splitlines()[-1].strip()
    out.update(
        loss=record["loss"], grad_norm=record["grad_norm"], applied_grad_norm=record["applied_grad_norm"],
        weights={n: w.detach().float().clone() for n, w in model.named_parameters()},
        precision="bf16" if bf16 else "fp32", calls=calls,
        settings={
            "optimizer": f"{type(opt).__module__}.{type(opt).__qualname__} "
                         f"(TrainingArguments.optim {name(targs.optim)})",
            "lr": groups[0]["lr"], "betas": list(groups[0]["betas"]), "eps": groups[0]["eps"],
            "weight_decay": sorted({g["weight_decay"] for g in groups}),
            "adam_kernel": "fused" if groups[0].get("fused") else "foreach" if groups[0].get("foreach") else "loop",
            "lr_scheduler": f"{name(targs.lr_scheduler_type)} (warmup_steps {targs.warmup_steps})",
            "loss": f"{module.__file__}: ReMaxTrainer._compute_loss, {loss_source}",
            "grad_clip": targs.max_grad_norm,
            "kl": f"in the reward (remax_advantages), k1 per token, coefficient beta {trainer.beta}",
            "temperature": f"{trainer.temperature} (TRL's fused LM head divides the logits by it)",
            "per_device_train_batch_size": targs.per_device_train_batch_size,
            "gradient_accumulation_steps": targs.gradient_accumulation_steps,
            "num_generations": trainer.num_generations, "model_dtype": str(dtype).removeprefix("torch."),
            "mixed_precision": trainer.accelerator.mixed_precision, "device": str(trainer.accelerator.device),
        })
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batch", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--trainer", type=Path, default=TRAINER, help="remax_trl.py or a copy of it")
    ours, theirs = p.parse_known_args()
    module = load_trainer(ours.trainer)
    batch, _ = read_batch(ours.batch)
    record: dict = {}
    record_advantages(module, record)
    trainer, state, calls = train_one_step(module, ours.batch, theirs, batch, observer(record))
    save_update(collect_output(module, trainer, record, state, calls, batch), ours.out)

if __name__ == "__main__":
    main()
