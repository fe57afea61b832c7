"""The TRL update parity: inside/parity_driver.py, in the TRL environment of the config, makes one update of the
harness's ReMax trainer on harness.parity's batch with TRL's own training loop (Trainer.train, max_steps 1).

Facts of the pinned source (TRL 1.16.0, Transformers 5.24.0, Accelerate 1.16.0) the driver relies on:
- trl/trainer/rloo_trainer.py: RLOOTrainer._generate tokenizes the prompts (_tokenize_prompts) and gets the completion
  token lists, up to and including EOS, from _generate_single_turn(prompt_ids, images, multimodal_fields), the only
  generation call (Transformers' generate under unwrap_model_for_generation); it returns those lists unchanged, and
  _calculate_rewards passes them to each plain reward function as `completion_ids` (the driver's seam for both);
- RLOOTrainer.__init__ builds the reference model from the policy's path when beta != 0 (create_model_from_path, the
  policy's dtype), and patches both models with add_fused_lm_head (trl/trainer/utils.py: log-probs of the labels,
  logits divided by the temperature); _get_per_token_logps_and_entropies calls them with fused_lm_head=True;
- RLOOTrainer._prepare_inputs calls _generate_and_score_completions once per steps_per_generation x num_iterations
  (1 x 1 in remax_trl), then shuffles the rows (shuffle_sequence_dict) before the loss;
- transformers/trainer.py: _inner_training_loop runs training_step (compute_loss, the loss divided by the
  accumulation steps, accelerator.backward), then _clip_grad_norm (accelerator.clip_grad_norm_ at max_grad_norm,
  returning the norm before clipping), then optimizer.step; _maybe_log_save_evaluate logs `loss` and that
  `grad_norm` unrounded; callbacks' on_train_begin gets the prepared optimizer (Accelerate's AcceleratedOptimizer,
  the torch optimizer at .optimizer).
"""

from __future__ import annotations

from pathlib import Path

from harness.frameworks.determinism import determinism
from harness.frameworks.registry import environment, get_adapter, on_cpu
from harness.frameworks.trl.plan import NAME, STRICT, trainer_settings
from harness.parity import driver_python, read_batch, run_driver

DRIVER = Path(__file__).with_name("inside") / "parity_driver.py"


def parity(config: dict, batch: Path, out: Path) -> None:
    _, settings = read_batch(batch)
    # The batch's settings through the plan's own mapping, so that a wrong mapping shows here as in a run. The driver
    # is one process: a GPU config is planned as one GPU, so that its one process takes the whole batch (a run on W
    # GPUs takes a token mean per process and DDP averages the W gradients: not measured here)
    launch = config["launch"] if on_cpu(config) else {**config["launch"], "gpus_per_node": 1}
    probe = {**config, "launch": launch, "remax": settings["remax"]}
    args = [*trainer_settings(probe, settings["seed"]), *determinism(probe, STRICT, None)[0]]
    env = environment(get_adapter(NAME), config)
    assert env is not None  # TRL always runs in an environment of its own
    run_driver(driver_python(env, config), DRIVER, batch, out, args, NAME, gpu=not on_cpu(config))
