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
from harness.frameworks.registry import VLLM_HEAD_DIMS, Adapter, on_cpu, register_framework, run_plan
from harness.frameworks.reward_serving import plan_record, server_block
from harness.inputs import resolve_inputs, task
from harness.io import atomic_path, write_json, write_text
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
# Stand-ins for the GPU-only vllm and flash_attn that OpenRLHF imports at module level: test-only, never installed.
# Stand-ins for OpenRLHF's GPU-only imports, for its code on a CPU (the conformance check and the tests).
STUBS = Path(__file__).with_name("cpu_stubs")
REWARD_PATH = "/get_reward"


# ---------------------------------------------------------------------------------------------------------- plan

def _flags(config: dict, seed: int, out_dir: Path, policy: str) -> tuple[list[str], list[dict]]:
    """train_ppo_ray's command line, and the shared hyperparameters as mapped onto it."""
    rc, oc, lc = config["remax"], config["openrlhf"], config["launch"]
    gpus = lc["gpus_per_node"]
    samples = rc["train_batch_size"] * rc["rollout_n"]
    hyper: list[dict] = [
        {"key": "policy.path", "shared": policy, "framework_key": "actor.model_name_or_path", "effective": policy},
        {"key": "seeds", "shared": seed, "framework_key": "train.seed (DeepSpeed/transformers seed, data shuffle; "
         "vLLM engine i gets seed + i)", "effective": seed},
        {"key": "remax.steps", "shared": rc["steps"], "framework_key": f"{PROMPTS} holds steps x train_batch_size "
         "prompts; train.num_episodes=1, train.max_epochs=1", "effective": rc["steps"]},
        {"key": "remax.train_batch_size", "shared": rc["train_batch_size"],
         "framework_key": "rollout.batch_size (prompts per step); train.batch_size = rollout.batch_size x "
         "n_samples_per_prompt: one optimizer step per step", "effective": rc["train_batch_size"]},
        {"key": "remax.rollout_n", "shared": rc["rollout_n"], "framework_key": "rollout.n_samples_per_prompt "
         "(+ one greedy response per prompt, from the ReMax agent)", "effective": rc["rollout_n"]},
        {"key": "remax.max_prompt_length", "shared": rc["max_prompt_length"],
         "framework_key": "data.max_len - rollout.max_new_tokens", "effective": rc["max_prompt_length"]},
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
        {"key": "launch.gpus_per_node", "shared": gpus, "framework_key": "actor/ref.num_gpus_per_node, "
         "vllm.num_engines (tensor_parallel_size 1, colocate_all)", "effective": gpus},
    ]
    argv = [
        *container.env_command(ENV, config, "python3"), "-m", "openrlhf.cli.train_ppo_ray",
        "--actor.model_name_or_path", policy,
        "--actor.num_nodes", "1", "--actor.num_gpus_per_node", str(gpus),
        "--ref.num_nodes", "1", "--ref.num_gpus_per_node", str(gpus),
        "--vllm.num_engines", str(gpus), "--vllm.tensor_parallel_size", "1",
        "--vllm.gpu_memory_utilization", str(oc["vllm_gpu_memory_utilization"]),
        "--train.colocate_all", "--vllm.enable_sleep", "--ds.enable_sleep",
        "--ds.zero_stage", str(oc["zero_stage"]), "--ds.param_dtype", "bf16",
        "--train.agent_func_path", str(out_dir / AGENT),
        "--data.prompt_dataset", str(out_dir / PROMPTS), "--data.input_key", "input", "--data.label_key", "label",
        "--data.max_len", str(rc["max_prompt_length"] + rc["max_response_length"]),
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
    return argv, hyper


def _check_launch(config: dict) -> None:
    rc, oc, lc = config["remax"], config["openrlhf"], config["launch"]
    if lc["gpus_per_node"] < 1:
        raise HarnessError("config: at launch.gpus_per_node: OpenRLHF needs GPUs (0 = this profile cannot run it)")
    if lc["nnodes"] != 1:
        raise HarnessError(f"config: at launch.nnodes: the OpenRLHF launch runs on one node (got {lc['nnodes']}); "
                           "a multi-node run needs a Ray cluster started across the nodes first")
    per_step = oc["train_micro_batch_size"] * lc["gpus_per_node"]
    samples = rc["train_batch_size"] * rc["rollout_n"]
    if samples % per_step:
        raise HarnessError(f"config: at openrlhf.train_micro_batch_size: remax.train_batch_size x remax.rollout_n = "
                           f"{samples} samples must split into micro-batches of {oc['train_micro_batch_size']} on "
                           f"each of {lc['gpus_per_node']} GPUs "
                           "(DeepSpeed's train batch = micro x accumulation x GPUs)")


# launch.sh's setup. The remax estimator goes into the installed package of this environment only (idempotent; it
# refuses another version); an Apptainer image got it when it was built (container.images.openrlhf.setup) and
# finds it already there. Ray's CLI comes from the environment, and a fresh local Ray cluster serves each run.
SETUP = """{python3} "$PLAN_DIR/{patch}"
export PATH={env_bin}:"$PATH"
unset RAY_ADDRESS
"""


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
    n_prompts = rc["steps"] * rc["train_batch_size"]
    if len(train) < n_prompts:
        raise HarnessError(f"config: at task.n_train: {len(train)} training prompts, but remax.steps x "
                           f"remax.train_batch_size = {n_prompts} are needed (OpenRLHF runs one pass over them)")
    policy = str(Path(inputs["policy"]["path"]).absolute())
    argv, hyper = _flags(config, seed, out_dir, policy)
    reward_url = f"http://{oc['reward_host']}:{oc['reward_port']}"
    strict_args, strict_env, determinism_record, strict_deviations = determinism(
        config, STRICT + ([] if on_cpu(config) else [BATCH_INVARIANT]), NOT_STRICT)
    argv += strict_args
    env_vars = {"PYTHONUNBUFFERED": "1", **strict_env}
    reward = plan_record(inputs["reward"], "served")
    run_id = f"{NAME}-{config['profile']}-s{seed}"
    with atomic_path(out_dir, owner=plan_owner(NAME, seed)) as tmp:
        tmp.mkdir()
        write_text(tmp / PROMPTS, "".join(json.dumps({"input": r["prompt"], "label": r["answer"]}) + "\n"
                                          for r in train[:n_prompts]))
        shutil.copy2(REMAX_DIR / AGENT, tmp / AGENT)
        shutil.copy2(REMAX_DIR / PATCH, tmp / PATCH)
        write_json(tmp / AGENT_CONFIG, {"reward_url": reward_url + REWARD_PATH,
                                        "min_tokens_is_max_tokens": rc["generation_length"] == "fixed"})
        write_text(tmp / "launch.sh", launch_script(
            title=f"OpenRLHF {VERSION} ReMax run planned by `remax-bench plan openrlhf`; its output also goes to "
                  f"RUN_DIR/{LOG}",
            argv=argv, env_vars=env_vars, env_check=container.env_check(ENV, config, "python3"),
            setup=SETUP.format(python3=shell_words(container.env_command(ENV, config, "python3")), patch=PATCH,
                               env_bin=shell_word(str(envs.ENV_ROOT / ENV / "bin"))),
            reward_server=server_block(config, inputs_dir, reward, host=oc["reward_host"],
                                                      port=oc["reward_port"],
                                                      health_timeout_s=oc["reward_health_timeout_s"]),
            log=LOG))
        write_json(tmp / "plan.json", {
            "framework": NAME, "framework_version": VERSION, "seed": seed, "run_id": run_id, "env": ENV,
            "argv": argv, "env_vars": env_vars, "n_gpus": config["launch"]["gpus_per_node"], "inputs": inputs,
            "hyperparameters": hyper, "deviations": strict_deviations, "reward_server": reward_url, "reward": reward,
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


# --------------------------------------------------------------------------------------------------- environments

def _run(cmd: list, what: str, **kw: Any) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)
    if proc.returncode:
        raise HarnessError(f"{what} failed (exit {proc.returncode}):\n" + (proc.stdout + proc.stderr)[-3000:])
    return proc


def ensure_validate_env(root: Path | None = None) -> Path:
    """The CPU environment that runs OpenRLHF's own code in the tests, with the remax patch applied; its python."""
    root = root or envs.ENV_ROOT
    python = envs.ensure_env(VALIDATE_ENV, root)
    _run([python, REMAX_DIR / PATCH], f"patching openrlhf in {root / VALIDATE_ENV}")
    return python


def run_validate(python: Path, *args: str | Path, timeout: float = 600) -> subprocess.CompletedProcess:
    """openrlhf_remax/validate.py in an OpenRLHF environment, with the GPU-only stand-ins and the harness importable."""
    env = {**os.environ, "PYTHONPATH": f"{STUBS}:{envs.REPO}"}
    return subprocess.run([str(python), str(REMAX_DIR / "validate.py"), *map(str, args)], capture_output=True,
                          text=True, env=env, timeout=timeout, cwd=envs.REPO)


# ---------------------------------------------------------------------------------------------------- conformance

TOLERANCE = 1e-5  # float32 arithmetic in a different order


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
    python = ensure_validate_env()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "conformance.json"
        proc = run_validate(python, "conformance", out)
        if proc.returncode:
            raise HarnessError(f"OpenRLHF conformance run failed:\n{(proc.stdout + proc.stderr)[-3000:]}")
        return conformance_table(json.loads(out.read_text()))


# Read in OpenRLHF 0.11.2's own source (the same facts tests/test_openrlhf.py works around with stand-in modules).
CPU_BLOCKER = ("OpenRLHF 0.11.2 imports flash_attn at module level (openrlhf/models/ring_attn_utils.py, reached by "
               "`import openrlhf.models`), and flash-attn 2.8.3 is a source package that needs CUDA to build; past "
               "that, its Ray trainer, DeepSpeed strategy and vLLM worker extension call torch.cuda and nccl directly "
               "(about 40 places in openrlhf/trainer/ray/, openrlhf/utils/deepspeed/deepspeed.py, "
               "vllm_worker_wrap.py)")


register_framework(Adapter(
    name=NAME,
    description=f"OpenRLHF {VERSION} (Ray + vLLM + DeepSpeed, colocated) with the harness's ReMax agent and estimator",
    ingest=ingest,
    log_glob=LOG,
    plan=plan,
    env=ENV,
    cpu_blocker=CPU_BLOCKER,
    conformance=conformance,
    module="openrlhf",
    head_dims=VLLM_HEAD_DIMS,
    saves_checkpoint=True,  # the final actor, where its --ckpt.* defaults put it: the run directory
))
