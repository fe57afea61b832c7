"""The verl plan: the launch directory of one ReMax run (plan.json, launch.sh, the dataset as verl parquet), with
verl's hydra overrides for the shared settings, the CPU plan's changes to them, and the determinism knobs.
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Any

import pandas as pd

from harness import HarnessError
from harness.frameworks.determinism import Knob, determinism
from harness.frameworks.registry import (
    check_vllm_cpu_head_dim,
    environment,
    get_adapter,
    on_cpu,
    run_id,
    write_plan,
)
from harness.frameworks.reward_serving import plan_record, server_block
from harness.inputs import resolve_inputs, task
from harness.io import atomic_path, write_text
from harness.results.layout import plan_owner
from harness.runtime.container import env_check, env_command
from harness.runtime.launch_script import LAUNCH_SCRIPT_ROLE, RUN_DIR, launch_script, ray_cluster_block

NAME = "verl"
VERSION = "0.9.1"
METRICS_LOG = "verl_metrics.jsonl"  # verl's file logger output, inside the run directory
VALIDATION_GENERATIONS = "validation_generations"  # trainer.validation_data_dir, inside the run directory
INSIDE = Path(__file__).with_name("inside")  # what runs in verl's own environment, named by path, never imported
REWARD_BRIDGE = INSIDE / "reward_function.py"
# The function of REWARD_BRIDGE that scores, by kind of shared reward, and how it scores.
REWARD_FUNCTION = {"rule": "compute_score", "model": "compute_score_served"}
SCORED_BY = {"rule": "in-process", "model": "served"}
TRAIN_PARQUET, VAL_PARQUET = "train.parquet", "val.parquet"
# The raw prompt text, as the reference backend feeds it: the shared task has no chat format, and verl always
# renders prompts through the tokenizer's chat template (actor_rollout_ref.model.custom_chat_template replaces it).
# BOS first, as a plain encode adds it with Llama tokenizers and the harness's own.
RAW_PROMPT_TEMPLATE = ("{% if bos_token %}{{ bos_token }}{% endif %}"
                       "{% for m in messages %}{{ m['content'] }}{% endfor %}")
# Every seed key in verl 0.9.1's ppo_trainer config. The critic and reward-model ones are unused by ReMax with a
# rule reward; they are set anyway so that no part of a run keeps verl's fixed default of 42.
SEED_KEYS = (
    "data.seed",
    "actor_rollout_ref.actor.data_loader_seed",
    "actor_rollout_ref.actor.fsdp_config.seed",
    "actor_rollout_ref.ref.fsdp_config.seed",
    "actor_rollout_ref.rollout.seed",
    "critic.data_loader_seed",
    "critic.fsdp.seed",
    "reward.reward_model.rollout.seed",
)


# The rollout/trainer mismatch (#51, harness.results.metrics.MISMATCH), measured on every step, as verl's defaults
# already have it; pinned so that a later default cannot turn it off. Neither changes what a step computes.
MISMATCH_OVERRIDES = (
    # vLLM returns the log-prob of each sampled token (processed_logprobs: after temperature and top-p), which
    # becomes the batch's rollout_log_probs (experimental/agent_loop/agent_loop.py, vllm_async_server.py).
    "actor_rollout_ref.rollout.calculate_log_probs=True",
    # The actor recomputes old_log_probs itself (bypass mode would copy the rollout's, a mismatch of 0 by
    # construction); rollout_is and rollout_rs stay null, so rollout_corr/ is a diagnostic only
    # (trainer/ppo/ray_trainer.py, rollout_corr_helper.py).
    "algorithm.rollout_correction.bypass_mode=False",
)
# The harness's hook (inside/remax_bench_verl_mismatch.py), which adds mean |delta| and token_mult_prob_error to
# verl's step metrics: verl/__init__.py imports the modules VERL_USE_EXTERNAL_MODULES names in each process that
# imports verl. launch.sh exports both variables before it starts anything, so the driver, the Ray cluster it starts
# on one node (or the nodes launch.sh starts with `ray start` for launch.nnodes > 1, srun passing its environment)
# and every Ray worker inherit them. PYTHONPATH is this folder alone: verl's environment (its venv, or its image)
# needs none of its own.
MISMATCH_HOOK = "remax_bench_verl_mismatch"
MISMATCH_ENV = {"VERL_USE_EXTERNAL_MODULES": MISMATCH_HOOK, "PYTHONPATH": str(INSIDE)}


def _hydra_value(value: object) -> str:
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_hydra_value(v) for v in value) + "]"
    if isinstance(value, str) and not re.fullmatch(r"[\w./+-]+", value):
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    return str(value)


def launch_overrides(config: dict, seed: int, plan_dir: Path, inputs: dict,
                     n_train: int) -> tuple[list[str], list[dict]]:
    """verl hydra overrides for this run, and the hyperparameter table (shared key -> verl key -> value)."""
    rc, vc = config["remax"], config["verl"]
    batches_per_epoch = n_train // rc["train_batch_size"]
    if batches_per_epoch < 1:
        raise HarnessError(f"config: at remax.train_batch_size: {rc['train_batch_size']} exceeds the dataset's "
                           f"{n_train} training prompts; verl drops incomplete batches, so no step could run")
    rows = rc["train_batch_size"] * rc["rollout_n"] / _verl_devices(config)
    if rows % vc["micro_batch_size_per_gpu"]:
        raise HarnessError(f"config: at verl.micro_batch_size_per_gpu: {vc['micro_batch_size_per_gpu']} does not "
                           f"divide the {rows:g} sampled rows each device gets per step (remax.train_batch_size x "
                           "remax.rollout_n / devices); verl's FSDP engine stops at its first forward pass otherwise")
    table = _shared_settings(config, seed, inputs)
    overrides = [
        "algorithm.adv_estimator=remax",
        "trainer.use_v1=False",
        *(f"{key}={_hydra_value(value)}" for _, _, key, value, *_ in table),
        f"data.train_files={_hydra_value([str(plan_dir / TRAIN_PARQUET)])}",
        f"data.val_files={_hydra_value([str(plan_dir / VAL_PARQUET)])}",
        "actor_rollout_ref.actor.ppo_epochs=1",
        f"actor_rollout_ref.model.custom_chat_template={_hydra_value(RAW_PROMPT_TEMPLATE)}",
        "actor_rollout_ref.rollout.name=vllm",
        *MISMATCH_OVERRIDES,
        f"actor_rollout_ref.rollout.tensor_model_parallel_size={vc['rollout_tensor_parallel_size']}",
        f"actor_rollout_ref.rollout.gpu_memory_utilization={vc['gpu_memory_utilization']}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={vc['micro_batch_size_per_gpu']}",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={vc['micro_batch_size_per_gpu']}",
        f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={vc['micro_batch_size_per_gpu']}",
        f"reward.custom_reward_function.path={_hydra_value(str(REWARD_BRIDGE))}",
        f"reward.custom_reward_function.name={REWARD_FUNCTION[inputs['reward']['kind']]}",
        *_trainer_overrides(config, seed, batches_per_epoch),
    ]
    hyperparameters = [{"key": k, "shared": s, "framework_key": fk, "effective": v, **({"means": m[0]} if m else {})}
                       for k, s, fk, v, *m in table]
    return overrides, hyperparameters


def _shared_settings(config: dict, seed: int, inputs: dict) -> list[tuple]:
    """The shared settings as verl takes them: (shared key, shared value, verl key, value passed[, what that value
    means in the shared spec's terms, where verl spells the same setting differently: the report compares meanings,
    not spellings])."""
    rc, launch = config["remax"], config["launch"]
    return [
        ("remax.steps", rc["steps"], "trainer.total_training_steps", rc["steps"]),
        ("remax.train_batch_size", rc["train_batch_size"], "data.train_batch_size", rc["train_batch_size"]),
        # One optimizer step per iteration, as in the reference: the PPO mini-batch is the whole batch, one epoch.
        ("remax.train_batch_size", rc["train_batch_size"], "actor_rollout_ref.actor.ppo_mini_batch_size",
         rc["train_batch_size"]),
        ("remax.rollout_n", rc["rollout_n"], "actor_rollout_ref.rollout.n", rc["rollout_n"]),
        ("remax.max_prompt_length", rc["max_prompt_length"], "data.max_prompt_length", rc["max_prompt_length"]),
        ("remax.max_response_length", rc["max_response_length"], "data.max_response_length",
         rc["max_response_length"]),
        ("remax.temperature", rc["temperature"], "actor_rollout_ref.rollout.temperature", rc["temperature"]),
        # vllm_async_server.py passes it to every request: samples, greedy baselines, validation.
        ("remax.generation_length", rc["generation_length"], "actor_rollout_ref.rollout.ignore_eos",
         rc["generation_length"] == "fixed", rc["generation_length"]),
        ("remax.top_p", rc["top_p"], "actor_rollout_ref.rollout.top_p", rc["top_p"]),
        ("remax.lr", rc["lr"], "actor_rollout_ref.actor.optim.lr", rc["lr"]),
        ("remax.grad_clip", rc["grad_clip"], "actor_rollout_ref.actor.optim.clip_grad", rc["grad_clip"]),
        ("remax.kl_coef", rc["kl_coef"], "algorithm.kl_ctrl.kl_coef", rc["kl_coef"]),
        # KL placement (harness.remax): per token in the reward, k1 estimator, fixed coefficient, none in the loss.
        ("remax.kl_coef", "in the reward", "algorithm.use_kl_in_reward", True, "in the reward"),
        ("remax.kl_coef", "k1 (logp - ref_logp)", "algorithm.kl_penalty", "kl", "k1 (logp - ref_logp)"),
        ("remax.kl_coef", "fixed", "algorithm.kl_ctrl.type", "fixed", "fixed"),
        ("remax.kl_coef", "not in the loss", "actor_rollout_ref.actor.use_kl_loss", False, "not in the loss"),
        # Absolute: launch.sh runs verl from the run directory.
        ("policy.path", inputs["policy"]["path"], "actor_rollout_ref.model.path",
         os.path.abspath(inputs["policy"]["path"]), inputs["policy"]["path"]),
        ("launch.gpus_per_node", launch["gpus_per_node"], "trainer.n_gpus_per_node",
         _verl_devices(config) // launch["nnodes"]),
        ("launch.nnodes", launch["nnodes"], "trainer.nnodes", launch["nnodes"]),
        *(("seeds", seed, key, seed) for key in SEED_KEYS),
    ]


def _trainer_overrides(config: dict, seed: int, batches_per_epoch: int) -> list[str]:
    """verl's training loop: its length, its loggers, its validation passes; no checkpoints."""
    steps = config["remax"]["steps"]
    return [
        # Enough epochs for total_training_steps (verl stops at whichever comes first).
        f"trainer.total_epochs={math.ceil(steps / batches_per_epoch)}",
        "trainer.logger=[console,file]",
        "trainer.project_name=remax-bench",
        f"trainer.experiment_name={run_id(NAME, config, seed)}",
        # The eval greedy accuracy, as the reference measures it: verl's own validation on the eval split (greedy:
        # rollout.val_kwargs' defaults) before the first step and after the last, outside verl's step timer.
        "trainer.val_before_train=True",
        # Its greedy responses, for step-0 agreement with the reference (ray_trainer._write_generations: one
        # {global_steps}.jsonl per validation pass, 0.jsonl before the first step).
        f"trainer.validation_data_dir={_hydra_value(f'{RUN_DIR}/{VALIDATION_GENERATIONS}')}",
        f"trainer.test_freq={steps}",
        # A timed benchmark: no checkpoints, never resume an earlier run's state.
        "trainer.save_freq=-1",
        "trainer.resume_mode=disable",
    ]


def _verl_devices(config: dict) -> int:
    """The devices verl is told it has, over all nodes: on a CPU one pretend GPU per node (CPU_SETTINGS)."""
    per_node = 1 if on_cpu(config) else config["launch"]["gpus_per_node"]
    return per_node * config["launch"]["nnodes"]


def to_verl_rows(rows: list[dict], kind: str) -> list[dict]:
    """Shared dataset rows -> verl's RL parquet schema (verl/utils/dataset/rl_dataset.py, examples/data_preprocess)."""
    return [{
        "data_source": f"remax-bench/{kind}",
        "prompt": [{"role": "user", "content": r["prompt"]}],
        "ability": "arithmetic",
        "reward_model": {"style": "rule", "ground_truth": r["answer"]},
        # verl passes extra_info to compute_score; the shared reward needs the prompt (reward_function.py).
        "extra_info": {"index": i, "id": r["id"], "split": r["split"], "prompt": r["prompt"]},
    } for i, r in enumerate(rows)]


DEVIATIONS = [
    {"key": "throughput tokens", "shared": "prompt + sampled response tokens over the whole step",
     "effective": "perf/total_num_tokens (no greedy tokens); greedy generation time inside timing_s/gen and step",
     "cause": "verl sends the greedy baseline requests with the samples and times them together, but counts only "
              "the sampled rows' tokens; tokens_baseline stays empty, throughput is comparable with the harness's"},
    {"key": "policy loss", "shared": "REINFORCE, token-mean",
     "effective": "PPO clipped surrogate, token-mean, one mini-batch, one epoch",
     "cause": "verl's actor always uses the clipped surrogate; with one on-policy update the ratio is 1, no token "
              "is clipped and the gradient equals REINFORCE's"},
    {"key": "seeds", "shared": "one seed per run",
     "effective": "vLLM engine seed = rollout.seed + replica rank",
     "cause": "verl seeds each vLLM replica separately (vllm_async_server.py); {actor,ref}.fsdp_config.seed acts "
              "only with fsdp_config.full_determinism, left off for timed runs"},
]

# remax.generation_length fixed, where verl's only option differs from the others' (and the reference's) EOS mask.
FIXED_LENGTH_DEVIATION = {
    "key": "remax.generation_length", "shared": "fixed: EOS masked until max_response_length",
    "effective": "rollout.ignore_eos: EOS can be drawn and decoding goes on past it",
    "cause": "verl has no minimum-length option (vLLM min_tokens); with ignore_eos every response still has "
             "max_response_length tokens, so the token counts match, but a response may hold text after an EOS, "
             "which the reward reads"}


# verl on the CPU (launch.device: cpu): the packages are envs/verl-cpu.txt (vllm-cpu instead of vLLM's CUDA
# build) with the CPU layer of harness/frameworks/verl/inside/cpu, which verl and vLLM load through their own plugin
# entry points and which acts only under VERL_PLATFORM=cpu. Each row below is one way a CPU run differs from the
# GPU plan: the hydra overrides or environment variables that make it, and why; all of them go into plan.json's
# deviations, so the report's fairness table shows them beside the figures.
RAY_NODE_OVERRIDES = ["+ray_kwargs.ray_init.num_gpus=1", "+ray_kwargs.ray_init.num_cpus=8"]
CPU_SETTINGS: list[dict[str, Any]] = [
    # With launch.nnodes > 1 each Ray node of the cluster launch.sh starts declares them instead (ray_cluster_block):
    # a driver that joins a cluster may not.
    {"overrides": RAY_NODE_OVERRIDES,
     "key": "launch.gpus_per_node", "gpu": "the node's GPUs", "effective": "one pretend GPU, 8 logical CPUs",
     "cause": "verl's resource pool asks Ray for a GPU per worker and would wait forever without one; the logical "
              "CPUs only let verl's actors be placed (2 cores do the work)"},
    {"env": {"VERL_PLATFORM": "cpu", "VERL_ENGINE_DEVICE": "cuda"}, "overrides": ["trainer.device=cpu"],
     "key": "device platform", "gpu": "nvidia (cuda, nccl)",
     "effective": "cpu (gloo), from the harness's CPU layer; the FSDP engine verl registers for cuda",
     "cause": "verl 0.9.1 has no CPU platform (it falls back to cuda + nccl); its FSDP engine is registered for "
              "cuda and npu only, and VERL_ENGINE_DEVICE is verl's own override of that choice"},
    {"overrides": ["actor_rollout_ref.actor.strategy=fsdp2", "actor_rollout_ref.ref.strategy=fsdp2"],
     "key": "training strategy", "gpu": "fsdp", "effective": "fsdp2, reference offloaded without pinned memory",
     "cause": "FSDP1 refuses CPU parameters with sync_module_states=True; FSDP2's reference offload pins host "
              "memory, which needs an accelerator (the CPU layer turns pinning off)"},
    {"overrides": ["+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
                   "actor_rollout_ref.model.use_remove_padding=False"],
     "key": "attention", "gpu": "flash_attention_2 with padding removed", "effective": "sdpa on padded batches",
     "cause": "FlashAttention needs CUDA"},
    {"overrides": ["actor_rollout_ref.actor.use_torch_compile=False", "actor_rollout_ref.ref.use_torch_compile=False",
                   "actor_rollout_ref.rollout.enforce_eager=True"],
     "key": "compilation", "gpu": "torch.compile (actor, ref), CUDA graphs (vLLM)", "effective": "eager",
     "cause": "no CUDA graphs on a CPU; compiling a 2-layer model costs more than it saves in a short run"},
    {"overrides": ["+actor_rollout_ref.rollout.enable_sleep_mode=False",
                   "actor_rollout_ref.rollout.free_cache_engine=False"],
     "key": "rollout sleep mode", "gpu": "on (weights and KV cache freed while training)", "effective": "off",
     "cause": "vLLM's CPU platform has no sleep mode; the transition then moves weights only, so "
              "timing_s/update_weights is not a GPU transition time"},
    {"env": {"VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": "1"},
     "key": "rollout engine", "gpu": "vLLM 0.24.0 (CUDA), packed linear kernels",
     "effective": "vllm-cpu 0.29.0, 1 GiB KV cache, linear layers by torch.nn.functional.linear",
     "cause": "vLLM's CPU build repacks linear weights and deletes the originals, which verl's per-step weight "
              "update loads into; the CPU layer keeps them (slower generation than the packed path)"},
    {"overrides": ["data.dataloader_num_workers=0", "actor_rollout_ref.rollout.agent.num_workers=1",
                   "reward.num_workers=1"],
     "key": "helper processes", "gpu": "verl's defaults", "effective": "no dataloader workers, one agent and one "
     "reward worker", "cause": "a 2-core machine: every extra process competes with the step for a core"},
]


def cpu_launch(config: dict, policy_dir: str | Path) -> tuple[list[str], dict, list[dict]]:
    """The CPU plan's extra overrides, environment variables and deviations; HarnessError for a policy that
    vLLM's CPU attention cannot serve."""
    check_vllm_cpu_head_dim(policy_dir)
    overrides = [o for s in CPU_SETTINGS for o in s.get("overrides", ())
                 if config["launch"]["nnodes"] == 1 or o not in RAY_NODE_OVERRIDES]
    env_vars = {k: v for s in CPU_SETTINGS for k, v in s.get("env", {}).items()}
    deviations = [{"key": s["key"], "shared": f"GPU plan: {s['gpu']}", "effective": s["effective"],
                   "cause": "CPU run: " + s["cause"]} for s in CPU_SETTINGS]
    from harness.runtime.locks import package_deviations  # CPU packages against the GPU lock's (#52)
    return overrides, env_vars, [*deviations, *package_deviations("verl", Path(__file__).with_name("envs"))]


# reproducibility.determinism strict (harness.frameworks.determinism), read in verl 0.9.1's and vLLM 0.29.0's sources.
TRAINING_DETERMINISM = Knob(
    "actor_rollout_ref.{actor,ref}.fsdp_config.full_determinism=True",
    "enable_full_determinism(seed) in each FSDP engine: CUBLAS_WORKSPACE_CONFIG, NCCL_DETERMINISTIC, "
    "torch.use_deterministic_algorithms(True, warn_only=True), cuDNN deterministic",
    "verl 0.9.1 trainer/config/engine/fsdp.yaml:39; workers/engine/fsdp/transformer_impl.py:156-157; "
    "workers/engine/utils.py:31-63",
    args=("actor_rollout_ref.actor.fsdp_config.full_determinism=True",
          "actor_rollout_ref.ref.fsdp_config.full_determinism=True"))
ROLLOUT_DETERMINISM = [
    Knob("actor_rollout_ref.rollout.full_determinism=True",
         "VERL_FULL_DETERMINISM, VLLM_BATCH_INVARIANT=1 and PYTHONHASHSEED before ray.init; each vLLM server runs "
         "enable_full_determinism(replica_rank + rollout.seed) and gives every request that seed; requests routed by "
         "hash, not load",
         "verl 0.9.1 trainer/config/rollout/rollout.yaml:27; trainer/main_ppo.py:47-50; "
         "workers/rollout/vllm_rollout/vllm_async_server.py:149-156, 626-627; workers/rollout/router.py:193-197",
         args=("actor_rollout_ref.rollout.full_determinism=True",)),
    Knob("actor_rollout_ref.rollout.enforce_eager=True", "no CUDA graphs in vLLM",
         "verl 0.9.1 trainer/config/rollout/rollout.yaml:52; vllm_async_server.py:339",
         args=("actor_rollout_ref.rollout.enforce_eager=True",)),
]
# The CPU plan runs vLLM eager already (CPU_SETTINGS); VLLM_BATCH_INVARIANT would reach kernels vllm-cpu lacks.
CPU_NOT_STRICT = ("the rollout: vllm-cpu 0.29.0 has no batch-invariant kernels (model_executor/determinism/"
                  "batch_invariant.py:920-953 replaces matmul for CUDA and XPU only, and its Triton softmax and bmm "
                  "need Triton, which the CPU build lacks), so verl's rollout full_determinism is left off; "
                  "generation is seeded (rollout.seed) but not batch-invariant")


def strict_settings(config: dict) -> tuple:
    """harness.frameworks.determinism's (args, env, record, deviations) for a run of this config: a run's and the
    parity driver's (parity.py)."""
    cpu = on_cpu(config)
    return determinism(config, [TRAINING_DETERMINISM] + ([] if cpu else ROLLOUT_DETERMINISM),
                       CPU_NOT_STRICT if cpu else None)


def plan(config: dict, seed: int, out_dir: str | Path, inputs_dir: str | Path) -> None:
    """Write the launch directory: plan.json, launch.sh, the dataset as verl parquet (train/val)."""
    out_dir = Path(out_dir).resolve()
    cpu = on_cpu(config)
    if config["launch"]["gpus_per_node"] < 1 and not cpu:
        raise HarnessError("config: at launch.gpus_per_node: verl needs GPUs (0 given) unless launch.device is cpu; "
                           "use a GPU profile such as workflows/config/a100x8.yaml, or "
                           "workflows/config/cpu-frameworks.yaml on a CPU")
    inputs = resolve_inputs(inputs_dir)
    reward = plan_record(inputs["reward"], SCORED_BY[inputs["reward"]["kind"]])
    dataset = task.read_dataset(inputs["dataset"]["path"])
    overrides, hyperparameters = launch_overrides(config, seed, out_dir, inputs, len(dataset["train"]))
    env = environment(get_adapter(NAME), config)
    assert env is not None  # verl runs in an environment of its own
    env_vars = {"VERL_FILE_LOGGER_PATH": f"{RUN_DIR}/{METRICS_LOG}", **MISMATCH_ENV}
    deviations = [*DEVIATIONS, *([FIXED_LENGTH_DEVIATION] if config["remax"]["generation_length"] == "fixed" else [])]
    if cpu:
        cpu_overrides, cpu_env_vars, cpu_deviations = cpu_launch(config, inputs["policy"]["path"])
        overrides, env_vars, deviations = [*overrides, *cpu_overrides], {**env_vars, **cpu_env_vars}, \
            [*deviations, *cpu_deviations]
    strict_args, strict_env, determinism_record, strict_deviations = strict_settings(config)
    overrides, env_vars, deviations = [*overrides, *strict_args], {**env_vars, **strict_env}, \
        [*deviations, *strict_deviations]
    argv = [*env_command(env, config), "-m", "verl.trainer.main_ppo", *overrides]
    plan_json = {
        "framework": NAME, "framework_version": VERSION, "seed": seed, "run_id": run_id(NAME, config, seed), "env": env,
        "device": config["launch"]["device"], "argv": argv, "env_vars": env_vars,
        "n_gpus": 0 if cpu else config["launch"]["gpus_per_node"] * config["launch"]["nnodes"],
        # What verl divides perf/throughput by (trainer.n_gpus_per_node x nnodes): one pretend GPU on a CPU.
        "framework_devices": _verl_devices(config),
        "inputs": inputs, "hyperparameters": hyperparameters, "deviations": deviations, "reward": reward,
        "determinism": determinism_record,
    }
    server = (server_block(config, inputs_dir, reward, host="127.0.0.1", port=None)
              if reward["scored_by"] == "served" else None)
    nnodes = config["launch"]["nnodes"]
    cluster = ray_cluster_block(env_command(env, config, "ray"), nnodes, _verl_devices(config) // nnodes,
                                env_command(env, config, "python"), local=cpu) if nnodes > 1 else None
    with atomic_path(out_dir, owner=plan_owner(NAME, seed)) as tmp:
        tmp.mkdir()
        for name, split in ((TRAIN_PARQUET, "train"), (VAL_PARQUET, "eval")):
            pd.DataFrame(to_verl_rows(dataset[split], config["task"]["kind"])).to_parquet(tmp / name, index=False)
        write_plan(tmp / "plan.json", plan_json, config)
        write_text(tmp / "launch.sh", launch_script(
            title=f"verl {VERSION} ReMax run planned by `remax-bench plan verl`; verl's metrics go to "
                  f"RUN_DIR/{METRICS_LOG}",
            argv=argv, env_vars=env_vars, env_check=env_check(env, config), reward_server=server, cluster=cluster),
            role=LAUNCH_SCRIPT_ROLE)
