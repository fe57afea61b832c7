"""The verl parity update: verl's own one ReMax update on harness.parity's batch (inside/parity_driver.py, in the
environment a run of the config uses), under the hydra overrides and environment the plan gives that run.

Facts from verl 0.9.1's source that the driver relies on:
- The legacy trainer's step (verl/trainer/ppo/ray_trainer.py RayPPOTrainer.fit, adv_estimator=remax) after
  generation: `_balance_batch` (trainer.balance_batch, on by default), `_compute_old_log_prob`,
  `_compute_ref_log_prob`, `apply_kl_penalty` (algorithm.use_kl_in_reward), `compute_advantage`
  (core_algos.compute_remax_outcome_advantage with `reward_baselines`), `_update_actor`.
- The worker is verl/workers/engine_workers.py ActorRolloutRefWorker (main_ppo_v0.BaseTaskRunner
  .add_actor_rollout_worker); 0.9.1 has no workers/actor/dp_actor.py nor fsdp_workers.py. Its TrainingWorker runs
  the FSDP engine (workers/engine/fsdp/transformer_impl.py FSDPEngineWithLMHead: forward_step under
  torch.autocast at the mixed-precision param dtype, bf16 unless engine mixed_precision says otherwise;
  optimizer_step: fsdp2_clip_grad_norm_ at optim.clip_grad, returning the norm before the clip, then the step)
  with the loss workers/utils/losses.py ppo_loss (core_algos.agg_loss by actor.loss_agg_mode, token-mean by
  default, over the mini-batch's tokens).
- The optimizer: workers/config/optimizer.py build_optimizer from actor.optim (trainer/config/optim/fsdp.yaml:
  torch.optim.AdamW, betas [0.9, 0.999], weight_decay 0.01, clip_grad 1.0, constant schedule, no warmup).
- The reference policy is loaded from actor_rollout_ref.model.path (the fused ref of ActorRolloutRefWorker
  .init_model), so the driver builds its ref worker with the path set to the batch's ref/.
"""

from __future__ import annotations

from pathlib import Path

from harness.frameworks.registry import environment, get_adapter, on_cpu
from harness.frameworks.verl import plan
from harness.parity import ACTOR, driver_python, read_batch, run_driver

DRIVER = Path(__file__).with_name("inside") / "parity_driver.py"


def driver_args(config: dict, batch: Path) -> list[str]:
    """The driver's arguments: `--env K=V` and hydra overrides, as plan.plan builds a run's launch.sh from the same
    plan functions, on the config with the batch's `remax` block and the batch's actor as the policy."""
    _, settings = read_batch(batch)
    run = {**config, "remax": settings["remax"]}
    inputs = {"policy": {"path": str(Path(batch, ACTOR).resolve())}, "reward": {"kind": config["reward"]["kind"]}}
    # The dataset only sizes the epochs (one batch each is enough); the driver reads no data files.
    overrides, _ = plan.launch_overrides(run, settings["seed"], Path(batch).resolve(), inputs,
                                         run["remax"]["train_batch_size"])
    env_vars: dict[str, str] = {}
    cpu = on_cpu(run)
    if cpu:
        cpu_overrides, env_vars, _ = plan.cpu_launch(run, inputs["policy"]["path"])
        overrides = [*overrides, *cpu_overrides]
    strict_args, strict_env, _, _ = plan.strict_settings(run)
    return [*(f"--env={k}={v}" for k, v in {**env_vars, **strict_env}.items()), *overrides, *strict_args]


def parity(config: dict, batch: Path, out: Path) -> None:
    """verl's update on the batch, written to `out` (harness.parity's driver form)."""
    env = environment(get_adapter(plan.NAME), config)
    assert env is not None  # verl runs in an environment of its own
    run_driver(driver_python(env, config), DRIVER, Path(batch), Path(out), driver_args(config, Path(batch)), plan.NAME,
               gpu=not on_cpu(config))
