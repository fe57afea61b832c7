"""The OpenRLHF plan: the launch directory of one ReMax run (prompts, the ReMax agent and patch, launch.sh,
plan.json), with train_ppo_ray's flags for the shared settings, the CPU plan's changes to them, and the determinism
knobs.
"""

from __future__ import annotations

import itertools
import json
import shutil
from pathlib import Path
from typing import Any

from harness import HarnessError
from harness.checkpoint import checkpoint_config
from harness.frameworks.determinism import Knob, determinism
from harness.frameworks.registry import (
    check_vllm_cpu_head_dim,
    environment,
    get_adapter,
    on_cpu,
    write_plan,
)
from harness.frameworks.registry import (
    run_id as framework_run_id,
)
from harness.frameworks.reward_serving import plan_record, server_block
from harness.inputs import resolve_inputs, task
from harness.io import atomic_path, write_json, write_text
from harness.results.layout import plan_owner
from harness.runtime import container, envs
from harness.runtime.launch_script import LAUNCH_SCRIPT_ROLE, fill, launch_script, shell_word, shell_words

NAME = "openrlhf"
VERSION = "0.11.2"
LOG = "openrlhf.log"
PROMPTS = "prompts.jsonl"
PROMPTS_ROLE = "OpenRLHF prompt file"  # what PROMPTS is (harness.io.WRITTEN)
INSIDE = Path(__file__).with_name("inside")  # what runs in OpenRLHF's own environment, named by path, never imported
REMAX_DIR = INSIDE / "remax"
AGENT, AGENT_CONFIG, PATCH = "remax_agent.py", "remax_agent.json", "remax_patch.py"
AGENT_CONFIG_ROLE = "OpenRLHF agent config"  # what AGENT_CONFIG is (harness.io.WRITTEN)
REWARD_PATH = "/get_reward"
# The first batch the patched estimator saw in the run, with OpenRLHF's advantages (remax_patch.py, record_batch).
ADVANTAGE_BATCH = "remax_advantage_batch.json"


def _flags(config: dict, seed: int, out_dir: Path, policy: str) -> tuple[list[str], list[dict], list[dict]]:
    """train_ppo_ray's command line, the shared hyperparameters as mapped onto it, and where they differ."""
    rc, oc = config["remax"], config["openrlhf"]
    gpus = _gpus(config)
    samples = rc["train_batch_size"] * rc["rollout_n"]
    max_len, deviations = _max_len(config, policy)
    argv = [
        *container.env_command(_env(config), config, "python3"), "-m", "openrlhf.cli.train_ppo_ray",
        "--actor.model_name_or_path", policy,
        "--actor.num_nodes", "1", "--actor.num_gpus_per_node", str(gpus),
        "--ref.num_nodes", "1", "--ref.num_gpus_per_node", str(gpus),
        "--vllm.num_engines", str(gpus), "--vllm.tensor_parallel_size", "1",
        "--vllm.gpu_memory_utilization", str(oc["vllm_gpu_memory_utilization"]),
        "--train.colocate_all", "--vllm.enable_sleep", "--ds.enable_sleep",
        "--ds.zero_stage", str(oc["zero_stage"]), "--ds.param_dtype", "bf16",
        "--train.agent_func_path", str(out_dir / AGENT),
        "--data.prompt_dataset", str(out_dir / PROMPTS), "--data.input_key", "input", "--data.label_key", "label",
        "--data.max_len", str(max_len),
        "--rollout.max_new_tokens", str(rc["max_response_length"]),
        "--rollout.batch_size", str(rc["train_batch_size"]),
        "--rollout.n_samples_per_prompt", str(rc["rollout_n"]),
        "--rollout.micro_batch_size", str(oc["rollout_micro_batch_size"]),
        "--rollout.temperature", str(rc["temperature"]), "--rollout.top_p", str(rc["top_p"]),
        "--train.batch_size", str(samples), "--train.micro_batch_size", str(oc["train_micro_batch_size"]),
        "--train.num_episodes", "1", "--train.max_epochs", "1", "--train.seed", str(seed),
        "--algo.advantage.estimator", "remax", "--algo.advantage.gamma", "1.0",
        "--algo.kl.init_coef", str(rc["kl_coef"]), "--algo.kl.estimator", "k1",
        "--actor.adam.lr", str(rc["lr"]), "--actor.adam.betas", "0.9", "0.999",
        "--actor.adam.weight_decay", "0.01", "--actor.lr_scheduler", "constant", "--actor.lr_warmup_ratio", "0",
        "--actor.max_norm", str(rc["grad_clip"]),
        "--logger.logging_steps", "1", "--eval.steps", "-1", "--ckpt.save_steps", "-1",
    ]
    if oc["gradient_checkpointing"]:
        argv.append("--actor.gradient_checkpointing_enable")
    if oc["packing_samples"]:
        argv.append("--ds.packing_samples")
    if oc["zero_stage"] == 0:  # found by the parity check (docs/frameworks.md, "Update parity"): update 0.741 as long
        deviations.append({
            "key": "optimizer.first_step", "shared": "Adam's first step on the first gradient",
            "effective": "Adam's second step (its update 0.744 as long)",
            "cause": "DeepSpeed's FP16_Optimizer, which wraps Adam for bf16 without ZeRO (ds.zero_stage 0), steps it "
                     "once with zero gradients when it is built (deepspeed/runtime/fp16/fused_optimizer.py, "
                     "initialize_optimizer_states); ZeRO stages 1-3 do not"})
    return argv, _hyperparameters(config, seed, policy, max_len), deviations


def _max_len(config: dict, policy: str) -> tuple[int, list[dict]]:
    """data.max_len, prompt and response budget together, within the policy's max_position_embeddings; the deviation
    where that leaves the prompt less than remax.max_prompt_length."""
    rc = config["remax"]
    positions = checkpoint_config(policy, "policy config", optional=("max_position_embeddings",)).get(
        "max_position_embeddings")
    max_len = rc["max_prompt_length"] + rc["max_response_length"]
    if not (positions and positions < max_len):
        return max_len, []
    return positions, [{
        "key": "remax.max_prompt_length", "shared": rc["max_prompt_length"],
        "effective": positions - rc["max_response_length"],
        "cause": f"data.max_len is also vLLM's max_model_len, which may not exceed the policy's "
                 f"max_position_embeddings ({positions}): the prompt budget is that less max_response_length, "
                 "which still holds the longest prompt (the shared policy is built for exactly that)"}]


def _hyperparameters(config: dict, seed: int, policy: str, max_len: int) -> list[dict]:
    """The shared hyperparameters as train_ppo_ray takes them (plan.json's table: shared key -> OpenRLHF's)."""
    rc = config["remax"]
    return [
        {"key": "policy.path", "shared": policy, "framework_key": "actor.model_name_or_path", "effective": policy},
        {"key": "seeds", "shared": seed, "framework_key": "train.seed (DeepSpeed/transformers seed; the prompt "
         "order, which stock 0.11.2 shuffles unseeded and remax_patch.py seeds with it; vLLM engine i gets seed + i; "
         "under strict, each sampled request's seed)", "effective": seed},
        {"key": "remax.steps", "shared": rc["steps"], "framework_key": f"{PROMPTS} holds steps x train_batch_size "
         "prompts (the training split, repeated where shorter); train.num_episodes=1, train.max_epochs=1",
         "effective": rc["steps"]},
        {"key": "remax.train_batch_size", "shared": rc["train_batch_size"],
         "framework_key": "rollout.batch_size (prompts per step); train.batch_size = rollout.batch_size x "
         "n_samples_per_prompt: one optimizer step per step", "effective": rc["train_batch_size"]},
        {"key": "remax.rollout_n", "shared": rc["rollout_n"], "framework_key": "rollout.n_samples_per_prompt "
         "(+ one greedy response per prompt, from the ReMax agent)", "effective": rc["rollout_n"]},
        {"key": "remax.max_prompt_length", "shared": rc["max_prompt_length"],
         "framework_key": "data.max_len - rollout.max_new_tokens (data.max_len is also vLLM's max_model_len, so it "
         "stays within the policy's max_position_embeddings)", "effective": max_len - rc["max_response_length"]},
        {"key": "remax.max_response_length", "shared": rc["max_response_length"],
         "framework_key": "rollout.max_new_tokens (samples and greedy)", "effective": rc["max_response_length"]},
        {"key": "remax.generation_length", "shared": rc["generation_length"],
         "framework_key": "vLLM SamplingParams.min_tokens, set by the ReMax agent (remax_agent.json "
         "min_tokens_is_max_tokens; no OpenRLHF flag: train_ppo_ray never sets min_new_tokens, so its default 1 "
         "applies otherwise)", "effective": rc["generation_length"]},
        {"key": "remax.temperature", "shared": rc["temperature"], "framework_key": "rollout.temperature",
         "effective": rc["temperature"]},
        {"key": "remax.top_p", "shared": rc["top_p"], "framework_key": "rollout.top_p", "effective": rc["top_p"]},
        {"key": "remax.lr", "shared": rc["lr"], "framework_key": "actor.adam.lr (constant schedule, no warm-up; "
         "AdamW betas 0.9/0.999, weight decay 0.01 as torch's AdamW, but not on norm weights and biases: "
         "get_optimizer_grouped_parameters; the parity check measured it at 4e-4 of an update)", "effective": rc["lr"]},
        {"key": "remax.kl_coef", "shared": rc["kl_coef"], "framework_key": "algo.kl.init_coef (fixed; k1 in the "
         "reward, algo.kl.use_loss off)", "effective": rc["kl_coef"]},
        {"key": "remax.grad_clip", "shared": rc["grad_clip"], "framework_key": "actor.max_norm",
         "effective": rc["grad_clip"]},
        {"key": "launch.gpus_per_node", "shared": config["launch"]["gpus_per_node"],
         "framework_key": "actor/ref.num_gpus_per_node, vllm.num_engines (tensor_parallel_size 1, colocate_all)",
         "effective": _gpus(config)},
    ]


def _gpus(config: dict) -> int:
    """The GPUs OpenRLHF is told it has on the node: on a CPU one pretend GPU (CPU_SETTINGS)."""
    return 1 if on_cpu(config) else config["launch"]["gpus_per_node"]


def _env(config: dict) -> str:
    env = environment(get_adapter(NAME), config)
    assert env is not None  # OpenRLHF runs in an environment of its own
    return env


def _check_launch(config: dict) -> None:
    rc, oc, lc = config["remax"], config["openrlhf"], config["launch"]
    if lc["gpus_per_node"] < 1 and not on_cpu(config):
        raise HarnessError("config: at launch.gpus_per_node: OpenRLHF needs GPUs (0 = this profile cannot run it)")
    if lc["nnodes"] != 1:
        raise HarnessError(f"config: at launch.nnodes: the OpenRLHF launch runs on one node (got {lc['nnodes']}); "
                           "a multi-node run needs a Ray cluster started across the nodes first")
    per_step = oc["train_micro_batch_size"] * _gpus(config)
    samples = rc["train_batch_size"] * rc["rollout_n"]
    if samples % per_step:
        raise HarnessError(f"config: at openrlhf.train_micro_batch_size: remax.train_batch_size x remax.rollout_n = "
                           f"{samples} samples must split into micro-batches of {oc['train_micro_batch_size']} on "
                           f"each of {_gpus(config)} GPUs "
                           "(DeepSpeed's train batch = micro x accumulation x GPUs)")


# launch.sh's setup. The remax estimator goes into the installed package of this environment only (idempotent; it
# refuses another version); an Apptainer image got it when it was built (container.images.openrlhf.setup) and
# finds it already there. Ray's CLI comes from the environment, and a fresh local Ray cluster serves each run.
SETUP = Path(__file__).with_name("templates") / "setup.sh.j2"  # launch.sh lines: patch OpenRLHF, its env's bin first


# OpenRLHF on the CPU (launch.device: cpu): the packages are envs/openrlhf-cpu.txt (vllm-cpu instead of
# vLLM's CUDA build, DeepSpeed on its cpu accelerator) with the CPU layer of harness/frameworks/openrlhf/inside/cpu,
# which every process of that environment loads at start-up and which acts only under REMAX_BENCH_OPENRLHF_CPU=1. Each
# row is one way a CPU run differs from the GPU plan: the flags it drops and adds, or the environment variables, and
# why; all of them go into plan.json's deviations, so the report's fairness table shows them beside the figures.
CPU_SETTINGS: list[dict[str, Any]] = [
    {"env": {"REMAX_BENCH_OPENRLHF_CPU": "1", "REMAX_BENCH_OPENRLHF_CPU_GPUS": "1"},
     "key": "launch.gpus_per_node", "gpu": "the node's GPUs (actor, reference and vLLM engines on each)",
     "effective": "one pretend GPU, shared by one actor, one reference and one vLLM engine",
     "cause": "OpenRLHF's placement groups ask Ray for {GPU: 1, CPU: 1} bundles and would wait forever without a GPU; "
              "the CPU layer starts Ray with one pretend GPU"},
    {"env": {"DS_ACCELERATOR": "cpu"}, "key": "device", "gpu": "cuda (DeepSpeed, torch.cuda)",
     "effective": "cpu: DeepSpeed's cpu accelerator (gloo), OpenRLHF's torch.cuda calls answered by the CPU layer",
     "cause": "OpenRLHF calls torch.cuda.set_device, synchronize and current_device directly, and builds its replay "
              "buffer's device as cuda:N; the CPU layer sends them to the CPU"},
    {"drop": ["--vllm.enable_sleep", "--ds.enable_sleep"], "key": "sleep mode",
     "gpu": "on (vLLM and DeepSpeed free their memory while the other works)", "effective": "off",
     "cause": "vLLM's CPU platform has no sleep mode; the transition then moves weights only, so timing/broadcast "
              "is not a GPU transition time"},
    {"args": ["--vllm.sync_backend", "gloo"], "key": "weight sync",
     "gpu": "nccl through CUDA IPC (colocated)",
     "effective": "vLLM's StatelessProcessGroup TCP store, the whole state reloaded into vLLM once per sync",
     "cause": "no NCCL or CUDA IPC on a CPU; vllm-cpu repacks linear weights after loading, so OpenRLHF's "
              "per-parameter load cannot work and the CPU layer reloads the sync's weights in one call"},
    {"args": ["--ds.attn_implementation", "sdpa"], "drop": ["--ds.packing_samples"], "key": "attention",
     "gpu": "flash_attention_2, packed samples", "effective": "sdpa on padded batches",
     "cause": "FlashAttention needs CUDA; the flash_attn module OpenRLHF imports is a stand-in that this path never "
              "calls (packing off)"},
    {"args": ["--vllm.enforce_eager"], "key": "compilation", "gpu": "CUDA graphs (vLLM)", "effective": "eager",
     "cause": "no CUDA graphs on a CPU"},
    {"env": {"VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": "1"}, "key": "rollout engine",
     "gpu": "vLLM 0.29.0 (CUDA)", "effective": "vllm-cpu 0.29.0, 1 GiB KV cache",
     "cause": "vLLM's CPU build"},
]


def cpu_launch(config: dict, policy_dir: str | Path, argv: list[str]) -> tuple[list[str], dict, list[dict]]:
    """The CPU plan's command line (the GPU one less the dropped flags, plus the added ones), environment variables
    and deviations; HarnessError for a policy that vLLM's CPU attention cannot serve."""
    check_vllm_cpu_head_dim(policy_dir)
    dropped = {a for s in CPU_SETTINGS for a in s.get("drop", ())}
    argv = [a for a in argv if a not in dropped] + [a for s in CPU_SETTINGS for a in s.get("args", ())]
    env_vars = {k: v for s in CPU_SETTINGS for k, v in s.get("env", {}).items()}
    deviations = [{"key": s["key"], "shared": f"GPU plan: {s['gpu']}", "effective": s["effective"],
                   "cause": "CPU run: " + s["cause"]} for s in CPU_SETTINGS]
    from harness.runtime.locks import package_deviations  # CPU packages against the GPU lock's (#52)
    return argv, env_vars, [*deviations, *package_deviations("openrlhf", Path(__file__).with_name("envs"))]


# reproducibility.determinism strict, read in OpenRLHF 0.11.2's and vLLM 0.29.0's sources.
STRICT = [
    Knob("--train.full_determinism_enable",
         "transformers.enable_full_determinism(seed) in each training process: CUBLAS_WORKSPACE_CONFIG, "
         "FLASH_ATTENTION_DETERMINISTIC, torch.use_deterministic_algorithms(True), cuDNN deterministic",
         "OpenRLHF 0.11.2 cli/train_ppo_ray.py:421; utils/deepspeed/deepspeed.py:83-89",
         args=("--train.full_determinism_enable",)),
    Knob("--vllm.enforce_eager", "no CUDA graphs in vLLM", "OpenRLHF 0.11.2 cli/train_ppo_ray.py:243; "
         "trainer/ray/vllm_engine.py:266", args=("--vllm.enforce_eager",)),
]
# OpenRLHF never sets it; the local Ray cluster train_ppo_ray starts inherits launch.sh's environment.
BATCH_INVARIANT = Knob("VLLM_BATCH_INVARIANT=1", "vLLM's batch-invariant matmul, softmax and attention",
                       "vLLM 0.29.0 envs.py:619; model_executor/determinism/batch_invariant.py:908-1011",
                       env={"VLLM_BATCH_INVARIANT": "1"})
# OpenRLHF gives vLLM no per-request seed (trainer/ppo_utils/samples_generator.py:199-207); the harness's ReMax agent
# gives each sampled request one under strict (remax_agent.json sampling_seed).
REQUEST_SEEDS = Knob("remax_agent.json sampling_seed", "a vLLM seed per sampled request, from the run's seed, the "
                     "prompt, its label and its occurrence: the same samples in a rerun, whatever order they finish in",
                     "harness/frameworks/openrlhf/inside/remax/remax_agent.py request_seed; vLLM 0.29.0 "
                     "v1/sample/ops/topk_topp_sampler.py:209-210 (a generator per seeded request)")
# OpenRLHF collects a step's samples in the order their rollouts finish (samples_generator.py:160-180, ray.wait); the
# harness's patch sorts them by their tokens under strict, so the training batch sums in one order.
SAMPLE_ORDER = Knob("REMAX_BENCH_OPENRLHF_SAMPLE_ORDER=content", "a step's samples sorted by their tokens before "
                    "training, not taken in the order their rollouts finish",
                    "harness/frameworks/openrlhf/inside/remax/remax_patch.py (trainer/ppo_utils/samples_generator.py)",
                    env={"REMAX_BENCH_OPENRLHF_SAMPLE_ORDER": "content"})
CPU_NOT_STRICT = ("the rollout: vllm-cpu 0.29.0 has no batch-invariant kernels, so a sample's logits may depend on "
                  "what else shares its batch")


def strict_settings(config: dict) -> tuple:
    """harness.frameworks.determinism's (args, env, record, deviations) for a run of this config: a run's and the
    parity driver's (parity.py)."""
    cpu = on_cpu(config)
    return determinism(config, [*STRICT, REQUEST_SEEDS, SAMPLE_ORDER] + ([] if cpu else [BATCH_INVARIANT]),
                       CPU_NOT_STRICT if cpu else None)


def plan(config: dict, seed: int, out_dir: str | Path, inputs_dir: str | Path) -> None:
    _check_launch(config)
    inputs = resolve_inputs(inputs_dir)
    rc, oc = config["remax"], config["openrlhf"]
    out_dir = Path(out_dir).resolve()
    train = task.read_dataset(inputs["dataset"]["path"])["train"]
    # OpenRLHF runs one pass (train.num_episodes 1) over steps x train_batch_size prompts: the training split in
    # order, again from its start where one pass is shorter than the run (as epochs would; OpenRLHF shuffles them).
    n_prompts = rc["steps"] * rc["train_batch_size"]
    policy = str(Path(inputs["policy"]["path"]).absolute())
    argv, hyper, deviations = _flags(config, seed, out_dir, policy)
    env_vars = {"PYTHONUNBUFFERED": "1", "REMAX_BENCH_ADVANTAGE_RECORD": f"$RUN_DIR/{ADVANTAGE_BATCH}"}
    if on_cpu(config):
        argv, cpu_env_vars, cpu_deviations = cpu_launch(config, policy, argv)
        env_vars.update(cpu_env_vars)
        deviations += cpu_deviations
    reward_url = f"http://{oc['reward_host']}:{oc['reward_port']}"
    strict_args, strict_env, determinism_record, strict_deviations = strict_settings(config)
    argv += [a for a in strict_args if a not in argv]
    env_vars.update(strict_env)
    reward = plan_record(inputs["reward"], "served")
    run_id = framework_run_id(NAME, config, seed)
    with atomic_path(out_dir, owner=plan_owner(NAME, seed)) as tmp:
        tmp.mkdir()
        write_text(tmp / PROMPTS, "".join(json.dumps({"input": r["prompt"], "label": r["answer"]}) + "\n"
                                          for r in itertools.islice(itertools.cycle(train), n_prompts)),
                   role=PROMPTS_ROLE)
        shutil.copy2(REMAX_DIR / AGENT, tmp / AGENT)
        shutil.copy2(REMAX_DIR / PATCH, tmp / PATCH)
        write_json(tmp / AGENT_CONFIG, {"reward_url": reward_url + REWARD_PATH,
                                        "min_tokens_is_max_tokens": rc["generation_length"] == "fixed",
                                        "sampling_seed": seed if determinism_record["mode"] == "strict" else None},
                   role=AGENT_CONFIG_ROLE)
        write_text(tmp / "launch.sh", launch_script(
            title=f"OpenRLHF {VERSION} ReMax run planned by `remax-bench plan openrlhf`; its output also goes to "
                  f"RUN_DIR/{LOG}",
            argv=argv, env_vars=env_vars, env_check=container.env_check(_env(config), config, "python3"),
            setup=fill(SETUP, python3=shell_words(container.env_command(_env(config), config, "python3")),
                       patch=PATCH, env_bin=shell_word(str(envs.ENV_ROOT / _env(config) / "bin"))),
            reward_server=server_block(config, inputs_dir, reward, host=oc["reward_host"],
                                                      port=oc["reward_port"],
                                                      health_timeout_s=oc["reward_health_timeout_s"]),
            log=LOG), role=LAUNCH_SCRIPT_ROLE)
        write_plan(tmp / "plan.json", {
            "framework": NAME, "framework_version": VERSION, "seed": seed, "run_id": run_id, "env": _env(config),
            # OpenRLHF's figures are per pretend GPU on a CPU; the harness counts a CPU run's devices as 0 (as verl's)
            "argv": argv, "env_vars": env_vars, "n_gpus": 0 if on_cpu(config) else _gpus(config), "inputs": inputs,
            "hyperparameters": hyper, "deviations": [*deviations, *strict_deviations], "reward_server": reward_url,
            "reward": reward,
            "determinism": determinism_record,
        }, config)
