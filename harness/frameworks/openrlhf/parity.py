"""OpenRLHF's update parity (harness/parity.py): one update of OpenRLHF 0.11.2's own training code on the parity
batch, run by inside/parity_driver.py in the run's environment (the CPU one on a CPU config), with the remax patch
applied as launch.sh applies it.

The driver gets exactly the command line a run of this config gets (plan._flags, then plan.cpu_launch on a CPU
config, then the strict determinism flags, as plan.plan composes them), with the batch's `remax` block in place of the
config's and the batch's actor as the policy; it parses them with train_ppo_ray's own parser. Facts of OpenRLHF 0.11.2
it relies on (read in the installed package):
- cli/train_ppo_ray.py: the parser is built under `__main__`, and `train(args)` calls `get_strategy(args)` right after
  `ray.init` (only if Ray is not initialised); a reference model group exists only if algo.kl.init_coef > 0.
- trainer/ray/ppo_actor.py PolicyModelActor.init_model_from_pretrained (Actor, strategy.prepare -> DeepSpeed engine,
  ActorPPOTrainer), .forward (the experience's log-probs), .append, .fit -> ActorPPOTrainer.ppo_train/training_step
  (PolicyLoss, strategy.backward, strategy.optimizer_step, strategy.get_grad_norm); trainer/ray/launcher.py
  ReferenceModelActor (Actor under the eval DeepSpeed config) and BaseDistributedActor (the rank's environment).
- trainer/ppo_utils/samples_generator.py SamplesGenerator._process_response_into_experience (an agent's response ->
  Experience); experience_maker.py RemoteExperienceMaker.make_experience_batch (k1 KL from both log-probs,
  compute_advantages_and_returns: the patched remax estimator, models/utils.compute_reward); its Ray calls are
  `ray.put`, `ray.get`, and the groups' async_run_method(_batch).
- trainer/ppo_trainer.py: the KL controller (FixedKLController(init_coef) without algo.kl.target), the value fit gets
  (kl_ctl.value), and max_steps = prompts x n_samples // train.batch_size (the plan's prompts file: steps x batch).
"""

from __future__ import annotations

from pathlib import Path

from harness.frameworks.openrlhf import plan
from harness.frameworks.openrlhf.conformance import ensure_validate_env
from harness.frameworks.registry import environment, get_adapter, on_cpu
from harness.parity import ACTOR, driver_python, read_batch, run_driver

DRIVER = plan.INSIDE / "parity_driver.py"


def driver_args(config: dict, batch: Path, seed: int) -> list[str]:
    """The driver's arguments: the environment variables a run's launch.sh sets for OpenRLHF's processes, then `--`
    and train_ppo_ray's flags, as plan.plan builds both for this config, the policy being the batch's actor."""
    policy = str((batch / ACTOR).resolve())
    argv, _, _ = plan._flags(config, seed, batch.resolve(), policy)
    env_vars: dict[str, str] = {}
    if on_cpu(config):
        argv, env_vars, _ = plan.cpu_launch(config, policy, argv)
    strict_args, strict_env, _, _ = plan.strict_settings(config)
    argv += [a for a in strict_args if a not in argv]
    env_vars.update(strict_env)
    # the flags start after the module name: what precedes it is the interpreter (or a container) running it
    flags = argv[argv.index("openrlhf.cli.train_ppo_ray") + 1:]
    # the prompts file holds steps x train_batch_size prompts (plan.plan): PPOTrainer's max_steps is the step count
    return [*(f"--env={k}={v}" for k, v in env_vars.items()), f"--max-steps={config['remax']['steps']}", "--",
            *flags]


def parity(config: dict, batch: Path, out: Path) -> None:
    _, settings = read_batch(batch)
    config = {**config, "remax": settings["remax"]}
    env = environment(get_adapter(plan.NAME), config)
    assert env is not None  # OpenRLHF runs in an environment of its own
    # the remax estimator is a patch of the installed package: a venv is patched as it is got
    python = driver_python(env, config, lambda name: ensure_validate_env(name=name))
    run_driver(python, DRIVER, Path(batch), Path(out), driver_args(config, Path(batch), settings["seed"]),
               plan.NAME, gpu=not on_cpu(config))
