"""Runs in verl's environment (verl-cpu on a CPU profile): ONE ReMax update of verl 0.9.1 on harness.parity's
fixed batch, with verl's own trainer and worker code, written in harness.parity's driver form.

    python parity_driver.py --batch DIR --out FILE [--env KEY=VALUE ...] HYDRA_OVERRIDE ...

The overrides and environment variables are the ones the adapter's plan gives a run of the same config
(harness.frameworks.verl.parity builds them with plan.py's functions); the config is composed from verl's own
`ppo_trainer` hydra config as `python -m verl.trainer.main_ppo` composes it, checked by verl's validate_config and
resolved as main_ppo_v0.TaskRunner.run resolves it.

What runs is verl's, called as the legacy trainer's step (ray_trainer.RayPPOTrainer.fit, adv_estimator=remax)
calls it, in its order: `_balance_batch`, `_compute_old_log_prob`, `_compute_ref_log_prob`, `apply_kl_penalty`,
`compute_advantage` (core_algos.compute_remax_outcome_advantage), `_update_actor`. The trainer's methods are called
on a stand-in for the trainer object that holds what they read (config, worker groups); below them everything is
verl's: engine_workers.ActorRolloutRefWorker -> TrainingWorker (train_mini_batch, infer_batch) -> the FSDP2 engine
(workers/engine/fsdp/transformer_impl.py FSDPEngineWithLMHead: forward under autocast, verl's optimizer builder,
fsdp2_clip_grad_norm_, the optimizer step) with the loss workers/utils/losses.ppo_loss (compute_policy_loss_vanilla,
agg_loss by actor.loss_agg_mode). The model is wrapped with FSDP2 on one gloo process, as the real CPU run does
(plan.CPU_SETTINGS: strategy fsdp2, the CPU layer's platform), not a plain module.

Replaced, at the narrowest seam, and why:
- Generation and the reward: the fixed batch stands in for the agent loop's output (prompts, responses,
  response_mask, input_ids, attention_mask, and position_ids as the agent loop computes them,
  verl.utils.model.compute_position_id_with_mask); the sampled scores are placed on the tokens by verl's own
  RewardManagerBase.assemble_rm_scores and read back by ray_trainer's extract_reward; `reward_baselines` is the
  batch's greedy reward (the trainer's is the greedy response's rm_scores summed, i.e. that reward).
- Ray: one worker per role is built in this process and called directly (the RayWorkerGroup of one rank would
  dispatch the whole batch to it unchanged); torch.distributed is a one-process gloo group, as in the CPU run.
- The reference policy: in the run it is ActorRolloutRefWorker's fused ref model, loaded from the actor's own
  `model.path` (the two start equal). The batch's actor is not its KL anchor, so the ref is a second
  ActorRolloutRefWorker (role "ref") of the same config with `model.path` set to the batch's ref/: the same
  TrainingWorker and engine code, another checkpoint.
- The rollout engine (vLLM) and the weight sync after the update are not built: no part of the update.
"""

from __future__ import annotations

import argparse
import copy
import os
import socket
from pathlib import Path
from typing import Any

import numpy as np
import torch


def _set_env(pairs: list[str]) -> None:
    """The plan's environment (VERL_PLATFORM=cpu loads the CPU layer when verl is first imported) and the one-rank
    process group a Ray worker would be given."""
    for pair in pairs:
        key, _, value = pair.partition("=")
        os.environ[key] = value
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))


def _config(overrides: list[str]) -> Any:
    """verl's ppo_trainer config with the plan's overrides, as main_ppo.main and TaskRunner.run leave it."""
    import verl.trainer
    from hydra import compose, initialize_config_dir  # type: ignore[import-not-found]
    from omegaconf import OmegaConf  # type: ignore[import-not-found]
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config
    from verl.utils.device import auto_set_device

    with initialize_config_dir(config_dir=str(Path(verl.trainer.__file__).parent / "config"), version_base=None):
        config = compose(config_name="ppo_trainer", overrides=overrides)
    auto_set_device(config)
    validate_config(config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    OmegaConf.resolve(config)
    # RayPPOTrainer._create_dataloader: trainer.total_training_steps into the actor's optimizer config.
    config.actor_rollout_ref.actor.optim.total_training_steps = config.trainer.total_training_steps
    return config


class _OneRankGroup:
    """What ray_trainer reads of a RayWorkerGroup, for one worker in this process."""

    def __init__(self, worker: Any) -> None:
        self.worker, self.world_size = worker, 1
        self._dispatch_info: dict = {}

    def _query_dispatch_info(self, mesh_name: str) -> list[int]:
        return [self.worker._query_dispatch_info(mesh_name)]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.worker, name)


def _rollout(batch: dict, config: Any) -> Any:
    """The fixed batch as the trainer holds it after generation and the reward: a DataProto of the agent loop's
    fields, the reward's rm_scores, the greedy baselines and a uid per prompt, rows in the batch's order."""
    from verl import DataProto
    from verl.experimental.reward_loop.reward_manager.base import RewardManagerBase
    from verl.utils.model import compute_position_id_with_mask

    width, n = batch["prompt_length"], batch["n"]
    ids, attn = batch["input_ids"].long(), batch["attention_mask"].long()
    rows = len(ids)
    data = DataProto.from_dict(
        tensors={"prompts": ids[:, :width], "responses": ids[:, width:], "input_ids": ids, "attention_mask": attn,
                 "response_mask": batch["response_mask"].long(), "position_ids": compute_position_id_with_mask(attn),
                 "reward_baselines": batch["baselines"].float()},
        non_tensors={"uid": np.array([str(i // n) for i in range(rows)], dtype=object),
                     "row": np.arange(rows)},
        meta_info={"temperature": config.actor_rollout_ref.rollout.temperature})
    data.batch["rm_scores"] = RewardManagerBase.assemble_rm_scores(data, batch["scores"].float().tolist())
    return data


def _weights(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter, unsharded (FSDP2 holds DTensors), under the Transformers model's names (fully_shard keeps
    them; a tied head is one parameter, as in Transformers' named_parameters)."""
    out = {}
    for name, p in module.named_parameters():
        t = p.full_tensor() if hasattr(p, "full_tensor") else p
        out[name] = t.detach().float().cpu().clone()
    return out


def _name(fn: Any) -> str:
    fn = getattr(fn, "__wrapped__", fn)
    return f"{fn.__module__}.{fn.__qualname__}"


def _build_roles(config: Any, batch_dir: Path) -> tuple[Any, Any]:
    """The actor's and the reference's ActorRolloutRefWorker, initialised (the reference first), the reference on the
    batch's ref/ (module docstring)."""
    from verl.workers.engine_workers import ActorRolloutRefWorker

    ref_config = copy.deepcopy(config.actor_rollout_ref)
    ref_config.model.path = str((batch_dir / "ref").resolve())
    ref_worker = ActorRolloutRefWorker(ref_config, role="ref")
    ref_worker.init_model()
    actor_worker = ActorRolloutRefWorker(config.actor_rollout_ref, role="actor")
    actor_worker.init_model()
    return actor_worker, ref_worker


def _stand_in_trainer(config: Any, actor_worker: Any, ref_worker: Any) -> Any:
    """What RayPPOTrainer's step methods read of the trainer: the config, the worker groups, the KL controller."""
    from types import SimpleNamespace

    from verl.trainer.ppo import core_algos
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    trainer = SimpleNamespace(config=config, actor_rollout_wg=_OneRankGroup(actor_worker),
                              ref_policy_wg=_OneRankGroup(ref_worker), ref_in_actor=False, distillation_config=None,
                              kl_ctrl_in_reward=core_algos.get_kl_controller(config.algorithm.kl_ctrl),
                              use_prefix_grouper=False)
    trainer._get_dp_size = lambda wg, role: RayPPOTrainer._get_dp_size(trainer, wg, role)
    return trainer


def _train_one_step(trainer: Any, batch: dict, config: Any) -> tuple[Any, dict]:
    """One step of the legacy trainer on the batch: the step's data (log-probs, KL-penalised rewards, advantages) and
    the actor update's metrics."""
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer, apply_kl_penalty, compute_advantage
    from verl.trainer.ppo.reward import extract_reward

    algo = config.algorithm
    # ray_trainer.RayPPOTrainer.fit, from the batch after generation to the actor update.
    data = _rollout(batch, config)
    if config.trainer.balance_batch:
        RayPPOTrainer._balance_batch(trainer, data, metrics={})
    data.meta_info["global_token_num"] = torch.sum(data.batch["attention_mask"], dim=-1).tolist()
    reward_tensor, _ = extract_reward(data)
    old_log_prob, _ = RayPPOTrainer._compute_old_log_prob(trainer, data)
    old_log_prob.batch.pop("entropys")
    data = data.union(old_log_prob)
    data = data.union(RayPPOTrainer._compute_ref_log_prob(trainer, data))
    data.batch["token_level_scores"] = reward_tensor
    if algo.use_kl_in_reward:
        data, _ = apply_kl_penalty(data, kl_ctrl=trainer.kl_ctrl_in_reward, kl_penalty=algo.kl_penalty)
    else:
        data.batch["token_level_rewards"] = data.batch["token_level_scores"]
    data = compute_advantage(data, adv_estimator=algo.adv_estimator, gamma=algo.gamma, lam=algo.lam,
                             num_repeat=config.actor_rollout_ref.rollout.n,
                             norm_adv_by_std_in_grpo=algo.get("norm_adv_by_std_in_grpo", True), config=algo)
    metrics = RayPPOTrainer._update_actor(trainer, data).meta_info["metrics"]
    return data, metrics


def _collect_output(trainer: Any, data: Any, metrics: dict, batch: dict, workers: tuple[Any, Any],
                    record: dict) -> dict:
    """The update in harness.parity's form, rows in the batch's order, with the settings as verl holds them."""
    from verl.trainer.ppo import core_algos
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer, apply_kl_penalty, compute_advantage
    from verl.trainer.ppo.reward import extract_reward
    from verl.workers.engine_workers import ActorRolloutRefWorker

    config, (actor_worker, ref_worker) = trainer.config, workers
    algo, engine = config.algorithm, actor_worker.actor.engine
    order = torch.as_tensor(np.argsort(data.non_tensor_batch["row"]))  # the batch's row order again
    mask = batch["response_mask"].float()

    def rows(key: str) -> torch.Tensor:
        return data.batch[key][order].float() * mask

    actor = config.actor_rollout_ref.actor
    opt, group = engine.optimizer, engine.optimizer.param_groups[0]
    loss_fn = core_algos.get_policy_loss_fn(actor.policy_loss.loss_mode)
    return {
        "logprobs": rows("old_log_probs"), "ref_logprobs": rows("ref_log_prob"), "advantages": rows("advantages"),
        "loss": float(np.sum(metrics["actor/loss"])), "grad_norm": float(np.sum(metrics["actor/grad_norm"])),
        **record, "weights": _weights(engine.module),
        "precision": {torch.bfloat16: "bf16", torch.float32: "fp32", torch.float16: "fp16"}[engine._autocast_dtype],
        "calls": [_name(f) for f in (
            RayPPOTrainer._balance_batch, extract_reward, RayPPOTrainer._compute_old_log_prob,
            RayPPOTrainer._compute_ref_log_prob, apply_kl_penalty, core_algos.kl_penalty, compute_advantage,
            core_algos.get_adv_estimator_fn(algo.adv_estimator), RayPPOTrainer._update_actor,
            ActorRolloutRefWorker.update_actor, type(actor_worker.actor).train_mini_batch,
            type(engine).train_batch, type(engine).forward_step, actor_worker.loss_fn.func, loss_fn,
            core_algos.agg_loss, type(engine).optimizer_step, type(opt).step)],
        "settings": {
            "optimizer": f"{type(opt).__module__}.{type(opt).__qualname__}", "lr": group["lr"],
            "betas": list(group["betas"]), "eps": group["eps"], "weight_decay": group["weight_decay"],
            "lr_scheduler": f"{actor.optim.lr_scheduler_type}, warmup {actor.optim.lr_warmup_steps} steps "
                            f"(ratio {actor.optim.lr_warmup_steps_ratio})",
            "loss": f"{actor.policy_loss.loss_mode} clipped surrogate (clip_ratio {actor.clip_ratio}), "
                    f"loss_agg_mode {actor.loss_agg_mode}",
            "loss_agg_mode": actor.loss_agg_mode, "grad_clip": engine.optimizer_config.clip_grad,
            "kl": f"in the reward: {bool(algo.use_kl_in_reward)}, estimator {algo.kl_penalty}, "
                  f"{algo.kl_ctrl.type} coefficient {trainer.kl_ctrl_in_reward.value}; in the loss: "
                  f"{bool(actor.use_kl_loss)}",
            "entropy_coeff": actor.entropy_coeff, "ppo_epochs": actor.ppo_epochs,
            "mini_batch": actor.ppo_mini_batch_size * config.actor_rollout_ref.rollout.n,
            "micro_batch_per_gpu": actor.ppo_micro_batch_size_per_gpu, "strategy": actor.strategy,
            "model_dtype": {"actor": str(next(engine.module.parameters()).dtype),
                            "ref": str(next(ref_worker.ref.engine.module.parameters()).dtype)},
            "forward_dtype": {"actor": str(engine._autocast_dtype), "ref": str(ref_worker.ref.engine._autocast_dtype)},
            "balance_batch": bool(config.trainer.balance_batch),
            "attn_implementation": str(engine.module.config._attn_implementation),
            "use_remove_padding": bool(config.actor_rollout_ref.model.use_remove_padding),
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--env", action="append", default=[])
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    _set_env(args.env)

    from harness.parity import grad_norm_hook, read_batch, save_update

    batch, _ = read_batch(args.batch)
    config = _config(args.overrides)
    algo = config.algorithm
    assert algo.adv_estimator == "remax" and not config.trainer.use_v1, "the plan must select the legacy ReMax trainer"

    actor_worker, ref_worker = _build_roles(config, args.batch)
    record: dict = {}
    grad_norm_hook(actor_worker.actor.engine.optimizer, record)
    trainer = _stand_in_trainer(config, actor_worker, ref_worker)
    data, metrics = _train_one_step(trainer, batch, config)
    save_update(_collect_output(trainer, data, metrics, batch, (actor_worker, ref_worker), record), args.out)

if __name__ == "__main__":
    main()
