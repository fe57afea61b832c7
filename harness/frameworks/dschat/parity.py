"""DeepSpeed-Chat's update parity: one update of the official ReMax code (pinned checkout) on harness.parity's batch,
made by inside/parity_driver.py in DeepSpeed-Chat's environment from the planned main.py arguments.

Facts of the pinned checkout (liziniu/ReMax 536ba49) the driver relies on:
- step3_rlhf_finetuning/main.py `main`: one iteration is generate_experience, MiniDataset(generation_batches,
  per_device_training_batch_size).add, actor.gradient_checkpointing_enable (with --actor_gradient_checkpointing),
  per micro-batch compute_loss and actor.backward(loss / len(exp_dataset)), then one actor.step(); there is no
  train_rlhf. `parse_args` is main.py's own.
- remax_trainer.py `DeepSpeedReMaxTrainer`: `_generate_sequence` calls `model.module.generate(prompts,
  attention_mask=, max_length=, pad_token_id=, ...)` and rewrites responses of at most one non-pad token;
  `generate_experience` scores with `reward_model.forward_value(...)["chosen_end_scores"]`, sampled then greedy;
  `compute_loss` -> `compute_returns` (clip_reward_value 5.0 and gamma from --gamma; per-token KL kl_ctl *
  -(logp - ref_logp) at its own token) -> `gather_log_probs` -> `actor_loss_fn` (token mean).
- rlhf_engine.py `DeepSpeedRLHFEngine`: `_init_actor` (utils/ds_utils.py get_train_ds_config: gradient_clipping
  1.0 hard-coded; optimizer betas (0.9, 0.95)), `_init_ref(actor_model_name_or_path)` (the reference from the actor's
  path), `_init_reward` (replaced, as the launcher replaces it).
- utils/utils.py `get_tokenizer`: pad token := EOS; utils/data/data_utils.py `DataCollatorRLHF`: prompts left-padded
  with it to --max_prompt_seq_len.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from harness.frameworks.dschat import plan
from harness.frameworks.registry import environment, get_adapter, on_cpu
from harness.parity import ACTOR, REF, driver_python, read_batch, run_driver

DRIVER = Path(__file__).with_name("inside") / "parity_driver.py"


def driver_args(config: dict, batch: Path, work: Path) -> list[str]:
    """The driver's options and main.py's arguments as the plan builds them for a run of `config`: the batch's
    policies laid out in `work` as the plan lays out a run's actor."""
    _, settings = read_batch(batch)
    config = {**config, "remax": settings["remax"]}
    checkout = plan.require_checkout(plan.checkout_dir(config))
    # The dataset sizes only decide how often the plan repeats the split, not the update.
    derived = plan._check_settings(config, config["task"]["n_train"], config["task"]["n_eval"])
    policies = {}
    for name in (ACTOR, REF):
        policies[name] = work / name
        plan._actor_dir((batch / name).resolve(), policies[name], policies[name])
    env = environment(get_adapter(plan.NAME), config)
    assert env is not None
    argv = plan.build_argv(config, settings["seed"], derived, policies[ACTOR], batch / "batch.pt",
                           {"kind": config["reward"]["kind"]}, env)
    return ["--checkout", str(checkout), "--ref", str(policies[REF]),
            "--accelerator", "cpu" if on_cpu(config) else "cuda", *plan.main_args(argv)]


def parity(config: dict, batch: Path, out: Path) -> None:
    env = environment(get_adapter(plan.NAME), config)
    assert env is not None
    # a folder without "llama" in its path: DeepSpeed-Chat loads a slow LlamaTokenizer for such a path (plan.plan)
    with tempfile.TemporaryDirectory(prefix="dschat-parity-") as work:
        args = driver_args(config, Path(batch), Path(work))
        run_driver(driver_python(env, config), DRIVER, Path(batch), Path(out), args, plan.NAME, gpu=not on_cpu(config))
