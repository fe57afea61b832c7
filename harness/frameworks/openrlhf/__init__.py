"""OpenRLHF 0.11.2 with a faithful ReMax, scored by the shared reward server.

OpenRLHF has no ReMax: every advantage estimator it ships subtracts a batch or group mean, or whitens. The harness
brings one (openrlhf_remax/): an agent executor (`--train.agent_func_path`) that per prompt asks the rollout engine
for the samples and one greedy response and scores both with the shared reward server, and a patch of the installed
package that adds `--algo.advantage.estimator remax` (reward minus the greedy reward, REINFORCE returns with gamma
1, KL in the reward, no normalisation). The patch is applied to the OpenRLHF environment only, by launch.sh before
each run; the Ray workers import the patched files.

- plan: a launch directory for one colocated node (actor, reference and vLLM engines share the GPUs, sleep mode),
  the prompts as JSONL {input, label}, the ReMax agent, the patch, launch.sh (starts the reward server, waits for
  its health check, runs `python3 -m openrlhf.cli.train_ppo_ray` with 0.11.2's dotted flags, stops the server).
  With `reward.kind: model` the server serves the shared reward-model checkpoint (`serve-reward --inputs`), so
  OpenRLHF is scored by the same forward pass as the other frameworks (plan.json "reward": scored_by "served"),
  not by OpenRLHF's own reward-model workers (`--reward.pretrain`).
- ingest: the `✨ Global step N: {...}` line the PPOTrainer Ray actor logs per step -> the common schema.
- conformance: the patched estimator, run from the installed package, on harness.conformance.CASES.
"""

from __future__ import annotations

import ast
import itertools
import json
import math
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from harness import HarnessError
from harness.frameworks.determinism import Knob, determinism
from harness.frameworks.registry import (
    VLLM_HEAD_DIMS,
    Adapter,
    check_vllm_cpu_head_dim,
    conformance_env,
    environment,
    on_cpu,
    register_framework,
    run_plan,
)
from harness.frameworks.registry import (
    run_id as framework_run_id,
)
from harness.frameworks.reward_serving import plan_record, server_block
from harness.inputs import resolve_inputs, task
from harness.io import atomic_path, read_json_object, write_json, write_text
from harness.results import metrics
from harness.results.layout import plan_owner
from harness.runtime import container, envs
from harness.runtime.launch_script import launch_script, shell_word, shell_words

NAME = "openrlhf"
VERSION = "0.11.2"
ENV = "openrlhf"
VALIDATE_ENV = "openrlhf-validate"
LOG = "openrlhf.log"
PROMPTS = "prompts.jsonl"
REMAX_DIR = Path(__file__).with_name("remax")
AGENT, AGENT_CONFIG, PATCH = "remax_agent.py", "remax_agent.json", "remax_patch.py"
# PYTHONPATH for OpenRLHF's own code in the validation environment (the conformance check and the tests): the vllm
# stand-in (cpu_stubs, test-only) and the flash_attn stand-in the CPU environment installs (cpu/, its CPU layer).
STUBS = os.pathsep.join(str(Path(__file__).with_name(d)) for d in ("cpu_stubs", "cpu"))
REWARD_PATH = "/get_reward"
# The first batch the patched estimator saw in the run, with OpenRLHF's advantages (remax_patch.py, record_batch).
ADVANTAGE_BATCH = "remax_advantage_batch.json"


# ---------------------------------------------------------------------------------------------------------- plan

def _flags(config: dict, seed: int, out_dir: Path, policy: str) -> tuple[list[str], list[dict], list[dict]]:
    """train_ppo_ray's command line, the shared hyperparameters as mapped onto it, and where they differ."""
    rc, oc = config["remax"], config["openrlhf"]
    gpus = _gpus(config)
    samples = rc["train_batch_size"] * rc["rollout_n"]
    positions = read_json_object(Path(policy) / "config.json", "policy config").get("max_position_embeddings")
    max_len = rc["max_prompt_length"] + rc["max_response_length"]
    deviations = []
    if positions and positions < max_len:
        deviations.append({
            "key": "remax.max_prompt_length", "shared": rc["max_prompt_length"],
            "effective": positions - rc["max_response_length"],
            "cause": f"data.max_len is also vLLM's max_model_len, which may not exceed the policy's "
                     f"max_position_embeddings ({positions}): the prompt budget is that less max_response_length, "
                     "which still holds the longest prompt (the shared policy is built for exactly that)"})
        max_len = positions
    hyper: list[dict] = [
        {"key": "policy.path", "shared": policy, "framework_key": "actor.model_name_or_path", "effective": policy},
        {"key": "seeds", "shared": seed, "framework_key": "train.seed (DeepSpeed/transformers seed, data shuffle; "
         "vLLM engine i gets seed + i)", "effective": seed},
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
         "AdamW betas 0.9/0.999, weight decay 0.01 as torch's AdamW)", "effective": rc["lr"]},
        {"key": "remax.kl_coef", "shared": rc["kl_coef"], "framework_key": "algo.kl.init_coef (fixed; k1 in the "
         "reward, algo.kl.use_loss off)", "effective": rc["kl_coef"]},
        {"key": "remax.grad_clip", "shared": rc["grad_clip"], "framework_key": "actor.max_norm",
         "effective": rc["grad_clip"]},
        {"key": "launch.gpus_per_node", "shared": config["launch"]["gpus_per_node"],
         "framework_key": "actor/ref.num_gpus_per_node, vllm.num_engines (tensor_parallel_size 1, colocate_all)",
         "effective": gpus},
    ]
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
    return argv, hyper, deviations


def _gpus(config: dict) -> int:
    """The GPUs OpenRLHF is told it has on the node: on a CPU one pretend GPU (CPU_SETTINGS)."""
    return 1 if on_cpu(config) else config["launch"]["gpus_per_node"]


def _env(config: dict) -> str:
    env = environment(ADAPTER, config)
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
SETUP = """{python3} "$PLAN_DIR/{patch}"
export PATH={env_bin}:"$PATH"
unset RAY_ADDRESS
"""


# OpenRLHF on the CPU (launch.device: cpu): the packages are workflows/envs/openrlhf-cpu.txt (vllm-cpu instead of
# vLLM's CUDA build, DeepSpeed on its cpu accelerator) with the CPU layer of harness/frameworks/openrlhf/cpu, which
# every process of that environment loads at start-up and which acts only under REMAX_BENCH_OPENRLHF_CPU=1. Each row
# is one way a CPU run differs from the GPU plan: the flags it drops and adds, or the environment variables, and why;
# all of them go into plan.json's deviations, so the report's fairness table shows them beside the figures.
CPU_ENV = "openrlhf-cpu"
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
    return argv, env_vars, deviations


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
NOT_STRICT = ("sampling: OpenRLHF gives vLLM no per-request seed and sends each request to the least-loaded engine, "
              "which depends on timing with more than one engine (trainer/ppo_utils/samples_generator.py:199-219)")


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
    strict_args, strict_env, determinism_record, strict_deviations = determinism(
        config, STRICT + ([] if on_cpu(config) else [BATCH_INVARIANT]), NOT_STRICT)
    argv += [a for a in strict_args if a not in argv]
    env_vars.update(strict_env)
    reward = plan_record(inputs["reward"], "served")
    run_id = framework_run_id(NAME, config, seed)
    with atomic_path(out_dir, owner=plan_owner(NAME, seed)) as tmp:
        tmp.mkdir()
        write_text(tmp / PROMPTS, "".join(json.dumps({"input": r["prompt"], "label": r["answer"]}) + "\n"
                                          for r in itertools.islice(itertools.cycle(train), n_prompts)))
        shutil.copy2(REMAX_DIR / AGENT, tmp / AGENT)
        shutil.copy2(REMAX_DIR / PATCH, tmp / PATCH)
        write_json(tmp / AGENT_CONFIG, {"reward_url": reward_url + REWARD_PATH,
                                        "min_tokens_is_max_tokens": rc["generation_length"] == "fixed"})
        write_text(tmp / "launch.sh", launch_script(
            title=f"OpenRLHF {VERSION} ReMax run planned by `remax-bench plan openrlhf`; its output also goes to "
                  f"RUN_DIR/{LOG}",
            argv=argv, env_vars=env_vars, env_check=container.env_check(_env(config), config, "python3"),
            setup=SETUP.format(python3=shell_words(container.env_command(_env(config), config, "python3")),
                               patch=PATCH, env_bin=shell_word(str(envs.ENV_ROOT / _env(config) / "bin"))),
            reward_server=server_block(config, inputs_dir, reward, host=oc["reward_host"],
                                                      port=oc["reward_port"],
                                                      health_timeout_s=oc["reward_health_timeout_s"]),
            log=LOG))
        write_json(tmp / "plan.json", {
            "framework": NAME, "framework_version": VERSION, "seed": seed, "run_id": run_id, "env": _env(config),
            # OpenRLHF's figures are per pretend GPU on a CPU; the harness counts a CPU run's devices as 0 (as verl's)
            "argv": argv, "env_vars": env_vars, "n_gpus": 0 if on_cpu(config) else _gpus(config), "inputs": inputs,
            "hyperparameters": hyper, "deviations": [*deviations, *strict_deviations], "reward_server": reward_url,
            "reward": reward,
            "determinism": determinism_record,
        })


# -------------------------------------------------------------------------------------------------------- ingest

# Format of OpenRLHF 0.11.2's per-step line: trainer/ppo_trainer.py, PPOTrainer.fit,
#     logger.info(f"✨ Global step {global_step}: {log_status}")
# through openrlhf/utils/logging_utils.py (format "%(levelname)s %(asctime)s %(filename)s:%(lineno)d] %(message)s"),
# printed by the PPOTrainer Ray actor and forwarded by Ray to the driver's stdout behind "(PPOTrainer pid=N) ",
# which Ray colours with ANSI codes even when stdout is not a terminal. log_status is a dict of floats (its repr).
STEP_LINE = re.compile(r"✨ Global step (\d+): (\{.*\})\s*$")
ANSI = re.compile(r"\x1b\[[0-9;]*m")
# repr() of a float that ast.literal_eval does not read back.
NONFINITE = re.compile(r"(?<![\w.'\"])(-?)(nan|inf)(?![\w'\"])")
REQUIRED = ("timing/generation", "timing/ppo_train", "timing/broadcast", "timing/step_total", "rollout/num_samples",
            "rollout/reward_mean", "rollout/response_length_mean", "response_length", "total_length", "remax_baseline")


def _literal(text: str) -> Any:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        repaired = NONFINITE.sub(lambda m: "None" if m.group(2) == "nan" else m.group(1) + "1e999", text)
        value = ast.literal_eval(repaired)
        return {k: math.nan if v is None else v for k, v in value.items()} if isinstance(value, dict) else value


def _samples_per_prompt(plan_: dict, path: Path) -> int:
    for h in plan_.get("hyperparameters", []):
        if h.get("key") == "remax.rollout_n":
            return int(h["effective"])
    raise HarnessError(f"{path}: plan.json lists no remax.rollout_n hyperparameter")


def _row(status: dict, step: int, n_gpus: int, per_prompt: int, where: str) -> dict:
    missing = [k for k in REQUIRED if k not in status]
    if missing:
        hint = " (not a ReMax run: was --algo.advantage.estimator remax with the ReMax agent used?)" \
            if "remax_baseline" in missing else ""
        raise HarnessError(f"{where}: step {step} lacks {', '.join(missing)}{hint}")
    samples = status["rollout/num_samples"]
    greedy_tokens = status.get("remax_baseline_tokens", math.nan)
    return {
        "step": step, "n_gpus": n_gpus,
        "time_step_s": status["timing/step_total"],
        "time_gen_s": status["timing/generation"],
        "time_transition_s": status["timing/broadcast"],
        "time_train_s": status["timing/ppo_train"],
        # Sample-weighted means over the step's samples, times the number of samples.
        "tokens_prompt": samples * (status["total_length"] - status["response_length"]),
        "tokens_response": samples * status["rollout/response_length_mean"],
        "tokens_baseline": greedy_tokens * samples / per_prompt,  # every sample carries its prompt's greedy length
        "reward_mean": status["rollout/reward_mean"],
        "reward_baseline_mean": status["remax_baseline"],
        "kl_mean": status.get("remax_kl_sum", math.nan),
        "response_length_mean": status["rollout/response_length_mean"],
    }


def ingest(logs: Sequence[Path], n_gpus: int | None = None) -> pd.DataFrame:
    rows = []
    for path in map(Path, logs):
        plan_ = run_plan(path, NAME)
        identity = {k: plan_[k] for k in ("framework", "framework_version", "run_id", "seed")}
        gpus = plan_["n_gpus"] if n_gpus is None else n_gpus
        per_prompt = _samples_per_prompt(plan_, path)
        with open(path, encoding="utf-8", errors="replace") as f:
            for lineno, line in enumerate(f, 1):
                if "✨ Global step" not in line:
                    continue
                where = f"{path}:{lineno}"
                match = STEP_LINE.search(ANSI.sub("", line))
                if not match:
                    raise HarnessError(f"{where}: garbled OpenRLHF step line (expected '✨ Global step N: {{...}}')")
                try:
                    status = _literal(match.group(2))
                except (ValueError, SyntaxError) as e:
                    raise HarnessError(f"{where}: the step's metrics are not a Python dict literal ({e})") from None
                if not isinstance(status, dict):
                    raise HarnessError(f"{where}: the step's metrics are not a dict")
                rows.append({**identity, **_row(status, int(match.group(1)), gpus, per_prompt, where)})
    return metrics.to_frame(rows, ", ".join(map(str, logs)))


# ----------------------------------------------------------------------------------------------------- evaluation

GREEDY_EVAL = REMAX_DIR / "greedy_eval.py"
EVAL_LOG = "openrlhf_eval.json"  # greedy_eval.py's record, beside OpenRLHF's log
CHECKPOINT = "ckpt"  # the final actor, where --ckpt.output_dir's default (./ckpt) puts it: the run directory


def evaluation(run_dir: Path) -> dict | None:
    """Eval greedy accuracy before and after training: vLLM's greedy decoding of the initial policy and of the actor
    OpenRLHF saved (remax/greedy_eval.py, in the run's environment, after the run; OpenRLHF's own evaluation samples
    and runs only after training steps)."""
    run_dir = Path(run_dir).resolve()
    plan_ = run_plan(run_dir / LOG, NAME)
    if not (run_dir / CHECKPOINT).is_dir():
        return None
    argv, out = plan_["argv"], run_dir / EVAL_LOG
    env = {**os.environ, **{k: v.replace("$RUN_DIR", str(run_dir)) for k, v in plan_["env_vars"].items()},
           "PYTHONPATH": str(envs.REPO)}
    # from the caller's working directory, against which the plan's input paths are written
    proc = subprocess.run([*argv[:argv.index("-m")], str(GREEDY_EVAL), str(run_dir), str(out)], capture_output=True,
                          text=True, env=env)
    if proc.returncode:
        raise HarnessError(f"{GREEDY_EVAL.name} failed on {run_dir} (exit {proc.returncode}):\n"
                           + (proc.stdout + proc.stderr)[-3000:])
    record = read_json_object(out, "greedy evaluation record")
    try:
        points: dict[str, dict[str, Any]] = {k: {"greedy_accuracy": float(record[k]["greedy_accuracy"]),
                      "reward_mean": float(record[k]["reward_mean"])} for k in ("before", "after")}
        points["before"]["responses"] = list(record["before"]["responses"])
    except (KeyError, TypeError, ValueError) as e:
        raise HarnessError(f"{out}: not greedy_eval.py's record ({e!r})") from None
    return {"run_id": plan_["run_id"], "split": "eval",
            "source": "greedy decoding by vLLM of the initial policy and of OpenRLHF's saved actor (greedy_eval.py)",
            **points}


# --------------------------------------------------------------------------------------------------- environments

def _run(cmd: list, what: str, **kw: Any) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)
    if proc.returncode:
        raise HarnessError(f"{what} failed (exit {proc.returncode}):\n" + (proc.stdout + proc.stderr)[-3000:])
    return proc


def ensure_validate_env(root: Path | None = None, name: str = VALIDATE_ENV) -> Path:
    """A CPU environment that runs OpenRLHF's own code outside a run (the validation environment of the tests and
    checks, or the CPU runs' own), with the remax patch applied; its python."""
    root = root or envs.ENV_ROOT
    python = envs.ensure_env(name, root)
    _run([python, REMAX_DIR / PATCH], f"patching openrlhf in {root / name}")
    return python


def run_validate(python: Path, *args: str | Path, timeout: float = 600,
                 stand_ins: bool = True) -> subprocess.CompletedProcess:
    """openrlhf_remax/validate.py in an OpenRLHF environment, with the harness importable and, in the validation
    environment, the GPU-only stand-ins (the CPU environment has vllm-cpu and its own flash_attn stand-in)."""
    env = {**os.environ, "PYTHONPATH": f"{STUBS}:{envs.REPO}" if stand_ins else str(envs.REPO)}
    return subprocess.run([str(python), str(REMAX_DIR / "validate.py"), *map(str, args)], capture_output=True,
                          text=True, env=env, timeout=timeout, cwd=envs.REPO)


# ---------------------------------------------------------------------------------------------------- conformance

TOLERANCE = 1e-5  # float32 arithmetic in a different order


def response_aligned(case: dict) -> dict:
    """A recorded batch as a shared case (harness.conformance): OpenRLHF's action_mask spans the sequence after its
    first token, zero over the prompt, while the shared cases start each response at position 0. Each row's mask, KL
    and advantages are shifted so; a mask that is not one contiguous span is refused."""
    rows: dict[str, list] = {"mask": [], "kl": [], "advantages": []}
    for i, mask in enumerate(case["mask"]):
        on = [j for j, m in enumerate(mask) if m]
        if on and on != list(range(on[0], on[-1] + 1)):
            raise ValueError(f"sample {i}: its action mask is not one contiguous span")
        start = on[0] if on else 0
        for key, out in rows.items():
            shifted = case[key][i][start:]
            out.append(shifted + [0] * (len(mask) - len(shifted)))
    return {**case, **rows}


def run_conformance(run_dir: Path) -> pd.DataFrame | None:
    """The advantages the patched OpenRLHF computed in the run's first step, on the batch it recorded there
    (ADVANTAGE_BATCH), against the reference ReMax on the same batch: one row per run."""
    import torch

    from harness.conformance import reference_advantages, verdict

    path = Path(run_dir) / ADVANTAGE_BATCH
    if not path.is_file():
        return None
    try:
        batches = json.loads(path.read_text())
        diff, samples = 0.0, 0
        for case in map(response_aligned, batches):
            mask = torch.tensor(case["mask"], dtype=torch.float32)
            ours = reference_advantages(case) * mask
            diff = max(diff, (ours - torch.tensor(case["advantages"], dtype=torch.float32) * mask).abs().max().item())
            samples += len(case["scores"])
    except (json.JSONDecodeError, KeyError, TypeError, ValueError, RuntimeError) as e:
        raise HarnessError(f"{path}: not a recorded advantage batch ({e!r})") from None
    match = verdict(diff) == "match"
    return pd.DataFrame([{
        "framework": NAME, "case": f"step 1 of {run_plan(path, NAME)['run_id']} ({samples} samples)",
        "max_abs_diff": diff, "verdict": "match" if match else "differs",
        "note": f"patched OpenRLHF {VERSION} 'remax' estimator in the run, on the batch it saw" if match else
                "the run's advantages differ from the reference ReMax on the same batch",
        "source": "from a real run"}])


def conformance_table(result: dict) -> pd.DataFrame:
    rows = []
    for case, r in result.items():
        diff = max(abs(a - b) for ra, rb in zip(r["advantages"], r["reference"]) for a, b in zip(ra, rb))
        match = diff <= TOLERANCE
        if match:
            note = f"patched OpenRLHF {VERSION} 'remax' estimator equals the reference"
        elif r["scalar_reward"]:
            note = (f"OpenRLHF {VERSION} takes one scalar reward per sample (a multi-turn agent sums its turns' "
                    "rewards), so every token gets total reward minus baseline, not the per-token reward-to-go")
        else:
            note = "the patched estimator differs from the reference"
        rows.append({"framework": NAME, "case": case, "max_abs_diff": diff, "verdict": "match" if match else "differs",
                     "note": note})
    return pd.DataFrame(rows)


def conformance(config: dict | None = None) -> pd.DataFrame:
    """OpenRLHF's patched ReMax estimator on the shared vectors, in its validation environment (no setting of the
    config changes it)."""
    env = conformance_env(ADAPTER, config)
    assert env is not None
    python = ensure_validate_env(name=env)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "conformance.json"
        proc = run_validate(python, "conformance", out, stand_ins=env == VALIDATE_ENV)
        if proc.returncode:
            raise HarnessError(f"OpenRLHF conformance run failed:\n{(proc.stdout + proc.stderr)[-3000:]}")
        return conformance_table(json.loads(out.read_text()))


ADAPTER = register_framework(Adapter(
    name=NAME,
    one_node=("this adapter starts OpenRLHF's Ray cluster on one node (a cluster across nodes is not planned for it "
              "yet: verl's launch.sh shows how, harness.runtime.launch_script.ray_cluster_block)"),
    description=f"OpenRLHF {VERSION} (Ray + vLLM + DeepSpeed, colocated) with the harness's ReMax agent and estimator",
    ingest=ingest,
    log_glob=LOG,
    plan=plan,
    env=ENV,
    cpu_env=CPU_ENV,
    check_env=VALIDATE_ENV,
    ray_roles={"RolloutRayActor": "a rollout engine (vLLM)", "PolicyModelActor": "the actor (DeepSpeed training)",
               "ReferenceModelActor": "the reference model"},
    conformance=conformance,
    evaluation=evaluation,
    run_conformance=run_conformance,
    module="openrlhf",
    head_dims=VLLM_HEAD_DIMS,
    saves_checkpoint=True,  # the final actor, where its --ckpt.* defaults put it: the run directory
    schema=Path(__file__).with_name("config.schema.yaml"),
    image=Path(__file__).with_name("image.yaml"),
    ports=lambda config: [("openrlhf.reward_port", config[NAME]["reward_host"], config[NAME]["reward_port"])],
))
