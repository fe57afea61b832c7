"""DeepSpeed-Chat adapter: the official ReMax code (GitHub liziniu/ReMax, pinned commit; built on DeepSpeed-Chat).

plan: a launch directory for `step3_rlhf_finetuning/main.py --algo remax` under the `deepspeed` launcher, run
through `dschat_launcher.py` (which times DeepSpeed's hybrid engine and scores with the shared reward); the shared
dataset exported in DeepSpeed-Chat's `local/jsonfile` layout; settings the code breaks on refused up front.
ingest: the launcher's JSON lines (measured), and DeepSpeed-Chat's own printed lines (perf.py
`print_throughput_step3`, main.py's `Average reward score:` line) as a cross-check, or as estimated rows where
nothing else exists. conformance: ReMax's own return computation (`DeepSpeedReMaxTrainer.compute_loss`, imported
from the checkout) on the shared vectors, against the reference advantage.

The shared reward replaces DeepSpeed-Chat's reward engine (dschat_launcher.SharedReward). A reward model
(`reward.kind: model`) is always served: launch.sh starts the shared reward server on the checkpoint and the
launcher posts decoded prompt + response texts to it ("served"), so the checkpoint scores DeepSpeed-Chat with the
same forward pass as the other frameworks. DeepSpeed-Chat's native reward engine cannot take the shared
checkpoint: utils/model/model_utils.py `create_critic_model` builds `AutoModel` + the `v_head` of
utils/model/reward_model.py `RewardModel` and loads the state dict of `pytorch_model.bin` with DeepSpeed-Chat's own
key names (a Hugging Face *ForSequenceClassification checkpoint keeps its head as `score` in safetensors), and it
feeds the actor's token ids to that model unchanged, which would also require the policy's tokenizer. No planned
path hands token ids across models, so no tokenizer has to match.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import re
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from harness import HarnessError
from harness.frameworks.determinism import Knob, determinism
from harness.frameworks.dschat import launcher as dschat_launcher
from harness.frameworks.registry import (
    PLAN_IDENTITY,
    Adapter,
    Checkout,
    environment,
    get_adapter,
    on_cpu,
    register_framework,
    run_id,
    run_plan,
)
from harness.frameworks.reward_serving import plan_record, server_block
from harness.inputs import resolve_inputs
from harness.io import atomic_path, write_json, write_text
from harness.results import metrics
from harness.results.layout import plan_owner
from harness.runtime.container import env_check, env_command
from harness.runtime.envs import ensure_env, pinned_version
from harness.runtime.launch_script import REWARD_URL, RUN_DIR, launch_script, shell_word

NAME = "dschat"
ENV = "dschat"  # workflows/envs/dschat.txt: the GPU run environment
CPU_ENV = "dschat-cpu"  # workflows/envs/dschat-cpu.txt: real DeepSpeed on the CPU, for CPU runs and checks
REMAX_COMMIT = "536ba49cc2f9a1a76941045388a44757e2533e75"
# The ReMax repository carries the DeepSpeed-Chat code it runs (utils/, step3's perf.py): nothing else is needed.
REMAX_FOLDERS = ("step3_rlhf_finetuning", "utils")
MAIN = "step3_rlhf_finetuning/main.py"
CHECKOUT_ENV = "REMAX_BENCH_REMAX_CHECKOUT"  # where conformance (which has no config) finds the checkout
STEPS_LOG = "dschat_steps.log"  # the launcher's JSON lines, in the run directory
LAUNCHER = Path(dschat_launcher.__file__)
ESTIMATED = "tokens_estimated"  # extra column: True where tokens come from batch size x configured lengths
# main.py: `if (global_step + 1) % (len(prompt_train_dataloader) // 20) == 0` (evaluation every 1/20 epoch)
MIN_BATCHES = 20


def framework_version(env: str = ENV) -> str:
    return f"ReMax@{REMAX_COMMIT[:7]}+deepspeed-{pinned_version(env, 'deepspeed')}"


def checkout_dir(config: dict | None = None) -> Path:
    """The config's dschat.checkout; without a config (conformance), $REMAX_BENCH_REMAX_CHECKOUT or the default."""
    path = config[NAME]["checkout"] if config else os.environ.get(CHECKOUT_ENV) or "results/src/ReMax"
    return Path(path).resolve()


def require_checkout(path: Path) -> Path:
    """The pinned checkout, or a HarnessError saying why it cannot be used."""
    if not (path / MAIN).is_file():
        raise HarnessError(f"{path}: no ReMax checkout ({MAIN} missing); make it with workflows/rules/setup.smk "
                           f"(liziniu/ReMax {REMAX_COMMIT[:7]}) or point {CHECKOUT_ENV} at one")
    head = subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    if head != REMAX_COMMIT:
        raise HarnessError(f"{path}: checkout is at {head or 'no git commit'}, not the pinned {REMAX_COMMIT}")
    edited = _local_changes(path)
    if edited:
        raise HarnessError(f"{path}: the pinned ReMax checkout has local changes ({edited}); it is no longer the "
                           "official code")
    return path


def _local_changes(path: Path) -> str:
    """Tracked files changed in the checkout (git status --porcelain), '' when it is clean."""
    return subprocess.run(["git", "-C", str(path), "status", "--porcelain", "--untracked-files=no"],
                          capture_output=True, text=True).stdout.strip().replace("\n", "; ")


# ---- plan ----------------------------------------------------------------------------------------------------

def split_sizes(data_split: str, size: int) -> list[int]:
    """How many rows DeepSpeed-Chat gives each training phase (utils/data/data_utils.py get_raw_dataset_split_index)."""
    splits = [float(s) for s in data_split.split(",")]
    total = sum(splits)
    index = [0]
    for s in splits:
        index.append(index[-1] + round(s / total * float(size)))
    diff = index[-1] - size
    index = [index[0]] + [i - diff for i in index[1:]]
    return [b - a for a, b in itertools.pairwise(index)]


def _batches(rows: int, world: int, batch: int) -> int:
    """Length of a rank's DataLoader over `rows` with DistributedSampler (pads to equal shares) and `batch`."""
    return math.ceil(math.ceil(rows / world) / batch)


def _check_settings(config: dict, n_train: int, n_eval: int) -> dict:
    """Derived settings; HarnessError for the settings DeepSpeed-Chat's ReMax cannot run or breaks on."""
    rc, launch, dc = config["remax"], config["launch"], config[NAME]
    world = 1 if on_cpu(config) else launch["gpus_per_node"] * launch["nnodes"]
    if launch["gpus_per_node"] == 0 and not on_cpu(config):
        raise HarnessError("config: at launch.gpus_per_node: 0; DeepSpeed-Chat needs GPUs unless launch.device is cpu "
                           "(workflows/config/cpu-frameworks.yaml), where its launcher's CPU layer runs it")
    if launch["nnodes"] != 1:
        raise HarnessError(f"config: at launch.nnodes: {launch['nnodes']}; this adapter launches one node "
                           "(the deepspeed launcher needs a hostfile for more)")
    if rc["rollout_n"] != 1:
        raise HarnessError(f"config: at remax.rollout_n: {rc['rollout_n']}; DeepSpeed-Chat's ReMax samples one "
                           "response per prompt (remax_trainer.py generate_experience); set it to 1")
    if rc["train_batch_size"] % world:
        raise HarnessError(f"config: at remax.train_batch_size: {rc['train_batch_size']} prompts do not divide over "
                           f"{world} GPUs (--per_device_generation_batch_size is per GPU)")
    per_device = rc["train_batch_size"] // world
    eval_phase1, _, eval_phase3 = split_sizes(dc["data_split"], n_eval)
    one_pass = _batches(split_sizes(dc["data_split"], n_train)[2], world, per_device)
    if one_pass == 0:
        raise HarnessError(f"config: at task.n_train / dschat.data_split: {n_train} training prompts leave no step-3 "
                           f"prompt with data_split {dc['data_split']!r}")
    # main.py runs one epoch (--enable_test_mode breaks out of the epoch loop) and needs MIN_BATCHES batches in it
    # (`(global_step + 1) % (len(prompt_train_dataloader) // 20)` divides by zero below that): the exported training
    # split is repeated until one epoch holds the steps, as verl runs more epochs over the same prompts.
    passes, batches = 1, one_pass
    while batches < max(rc["steps"], MIN_BATCHES):
        passes += 1
        batches = _batches(split_sizes(dc["data_split"], n_train * passes)[2], world, per_device)
    if eval_phase1 == 0 or eval_phase3 == 0:
        raise HarnessError(
            f"config: at task.n_eval / dschat.data_split: {n_eval} eval rows split {dc['data_split']!r} leave "
            f"{eval_phase1} for the perplexity evaluation and {eval_phase3} for the reward evaluation; main.py's "
            "evaluation_by_ppl fails on an empty loader (`step` is unbound), so both need at least one")
    return {"world": world, "per_device": per_device,
            "per_device_train": min(dc["per_device_training_batch_size"], per_device), "batches": batches,
            "passes": passes}


def _actor_dir(policy: Path, dest: Path, final: Path) -> None:
    """The policy as DeepSpeed-Chat loads it: links to every file, and a config.json naming this directory.

    DeepSpeed-Chat's load_hf_tokenizer (utils/utils.py) loads the tokenizer from the `_name_or_path` written in
    the checkpoint's config.json, not from the directory it is given (a hub name there means a download).
    """
    dest.mkdir()
    for f in sorted(policy.iterdir()):
        if f.name != "config.json":
            (dest / f.name).symlink_to(f.resolve())
    cfg = json.loads((policy / "config.json").read_text())
    cfg["_name_or_path"] = str(final)
    (dest / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")


def _export_data(rows: list[dict], dest: Path) -> int:
    """DeepSpeed-Chat's local/jsonfile rows (JSON lines): prompt, chosen (the answer), rejected (none exists)."""
    write_text(dest, "".join(json.dumps({"prompt": r["prompt"], "chosen": r["answer"], "rejected": None}) + "\n"
                             for r in rows))
    return len(rows)


def _reward_url(config: dict, reward: dict) -> str | None:
    """What the launcher's --reward-url gets: the server launch.sh starts for a reward model, or dschat.reward_url."""
    return REWARD_URL if reward["kind"] == "model" else config[NAME]["reward_url"]


def _served_at(config: dict) -> tuple[str, int | None]:
    """Host and port of the reward server that launch.sh starts: dschat.reward_url's, else loopback, a free port."""
    from urllib.parse import urlsplit

    url = config[NAME]["reward_url"]
    if not url:
        return "127.0.0.1", None
    parts = urlsplit(url)
    if not (parts.hostname and parts.port):
        raise HarnessError(f"config: at dschat.reward_url: {url!r} names no host and port for the reward server "
                           "that launch.sh starts for a reward model (e.g. http://127.0.0.1:18643)")
    return parts.hostname, parts.port


# How a CPU run (launch.device cpu) differs from the GPU plan: the launcher's CPU layer
# (dschat_launcher.install_cpu_layer) and the settings DeepSpeed's cpu accelerator needs. In plan.json's deviations.
CPU_DEVIATIONS = [
    {"key": "device", "shared": "the node's GPUs", "effective": "one process on DeepSpeed's cpu accelerator (gloo)",
     "cause": "the ReMax code's torch.cuda.set_device, .cuda() and to_device(batch, cuda) go to the CPU "
              "(dschat_launcher.install_cpu_layer); DeepSpeed 0.19.8 and Transformers 5 (workflows/envs/"
              "dschat-cpu.txt), not the 0.10.3 and 4.31 of the GPU environment, which have no CPU path"},
    {"key": "generation", "shared": "DeepSpeed's hybrid engine with its inference kernels",
     "effective": "the hybrid engine around the model's own generate()",
     "cause": "DeepSpeed's inference containers for a Llama policy are CUDA kernels; on the CPU the hybrid engine "
              "builds none and generates with Transformers, as it does for a model it has no policy for"},
    {"key": "optimizer", "shared": "FusedAdam", "effective": "torch.optim.AdamW, the same arguments",
     "cause": "FusedAdam is a CUDA op; torch's AdamW makes the same update"},
]
CPU_BF16 = {"key": "dschat.bf16", "shared": False, "effective": True,
            "cause": "DeepSpeed-Chat trains in fp16 unless --actor_bf16, and DeepSpeed's cpu accelerator has no fp16"}


# reproducibility.determinism strict. The ReMax code and DeepSpeed 0.19.8 have no determinism switch (main.py's --seed,
# always planned, seeds python, numpy and torch: utils/utils.py:102-108); torch's own switches are applied by the
# harness's launcher before main.py runs.
STRICT = [Knob("torch.use_deterministic_algorithms(True), cuDNN deterministic, CUBLAS_WORKSPACE_CONFIG=:4096:8",
               "nondeterministic torch kernels raise instead of running; set by the harness's launcher, in main.py's "
               "process",
               "dschat/launcher.py main (DETERMINISTIC_ENV); torch/__init__.py:1388 (PyTorch 2.13)",
               env={"CUBLAS_WORKSPACE_CONFIG": ":4096:8", dschat_launcher.DETERMINISTIC_ENV: "1"})]
NOT_STRICT = ("DeepSpeed-Chat's sampling (remax_trainer.py:91-95: do_sample with top_p 0.9, no per-request seed) and "
              "DeepSpeed's collectives: neither the ReMax code nor DeepSpeed 0.19.8 has a determinism switch")


def build_argv(config: dict, seed: int, settings: dict, actor: Path, dataset: Path, reward: dict,
               env: str) -> list[str]:
    rc, dc = config["remax"], config[NAME]
    main_args = [
        "--algo", "remax",
        "--data_path", "local/jsonfile",
        "--data_split", dc["data_split"],
        "--data_output_path", f"{RUN_DIR}/data_files",
        "--actor_model_name_or_path", str(actor),
        "--reward_model_name_or_path", str(actor),  # required by the parser; the launcher builds no reward model
        "--per_device_generation_batch_size", str(settings["per_device"]),
        "--per_device_training_batch_size", str(settings["per_device_train"]),
        "--per_device_eval_batch_size", str(settings["per_device_train"]),
        "--generation_batches", "1",
        "--ppo_epochs", "1",
        "--max_prompt_seq_len", str(rc["max_prompt_length"]),
        "--max_answer_seq_len", str(rc["max_response_length"]),
        "--actor_learning_rate", repr(float(rc["lr"])),
        "--actor_weight_decay", "0.0",
        "--num_train_epochs", "1",
        "--lr_scheduler_type", "constant",
        "--num_warmup_steps", "0",
        "--gradient_accumulation_steps", "1",
        "--kl_ctl", repr(float(rc["kl_coef"])),
        "--gamma", repr(float(dc["gamma"])),
        "--target_kl", repr(float(dc["target_kl"])),
        "--seed", str(seed),
        "--actor_zero_stage", str(dc["actor_zero_stage"]),
        "--reference_zero_stage", str(dc["reference_zero_stage"]),
        "--enable_hybrid_engine",
        "--disable_actor_dropout",
        *(["--actor_bf16"] if dc["bf16"] or on_cpu(config) else []),
        *(["--actor_gradient_checkpointing"] if dc["gradient_checkpointing"] else []),
        *(["--offload", "--offload_reference_model"] if dc["offload"] else []),
        "--enable_test_mode", "--test_stop_step", str(rc["steps"]),
        "--output_dir", f"{RUN_DIR}/output",
        "--deepspeed",
    ]
    return [
        *env_command(env, config, "deepspeed"), "--num_gpus", str(settings["world"]),
        "--master_port", str(dc["master_port"]),
        str(LAUNCHER), "--main", f"{RUN_DIR}/ReMax/{MAIN}", "--steps-log", f"{RUN_DIR}/{STEPS_LOG}",
        "--dataset", str(dataset),
        *(["--reward-url", _reward_url(config, reward)] if _reward_url(config, reward) else []),
        "--generation-length", config["remax"]["generation_length"],
        # The launcher's greedy eval decodes the whole eval split with Transformers in one process: cheap for the
        # CPU profile's small policy, hours for a 7B policy on a GPU node, where DeepSpeed-Chat reports none.
        "--greedy-eval", "on" if on_cpu(config) else "off",
        *main_args,
    ]


def main_args(argv: list[str]) -> list[str]:
    """The part of a planned argv that main.py's own parser reads: what follows the launcher and its options."""
    i = argv.index(str(LAUNCHER)) + 1
    while i < len(argv) and argv[i] in dschat_launcher.LAUNCHER_OPTIONS:
        i += 2
    return argv[i:]


def _checkout_check(checkout: Path) -> str:
    """launch.sh's check: refuse a checkout that is not the pinned, unedited official code."""
    return f"""CHECKOUT={shell_word(str(checkout))}
HEAD=$(git -C "$CHECKOUT" rev-parse HEAD 2>&1 || true)
if [ "$HEAD" != {REMAX_COMMIT} ]; then
  echo "$CHECKOUT: not the pinned ReMax checkout ({REMAX_COMMIT}; git rev-parse HEAD: $HEAD);" \\
    "make it with workflows/rules/setup.smk" >&2
  exit 2
fi
# A locally edited checkout would run as the official code under the pinned commit's name.
EDITED=$(git -C "$CHECKOUT" status --porcelain --untracked-files=no 2>&1 || true)
if [ -n "$EDITED" ]; then
  echo "$CHECKOUT: the pinned ReMax checkout has local changes (git status: $EDITED); it is no longer the" \\
    "official code" >&2
  exit 2
fi
"""


# DeepSpeed-Chat reads local/jsonfile data from data/ beside the checkout (utils/data/data_utils.py).
_RUN_LAYOUT = """ln -sfn "$CHECKOUT" "$RUN_DIR/ReMax"
ln -sfn "$PLAN_DIR/data" "$RUN_DIR/data"
mkdir -p "$RUN_DIR/output" "$RUN_DIR/data_files"
"""


def _deviations(config: dict) -> list[dict]:
    rc, dc = config["remax"], config[NAME]
    out = [
        {"key": "remax.kl_coef", "shared": rc["kl_coef"], "effective": rc["kl_coef"],
         "cause": "KL placement: DeepSpeed-Chat's ReMax adds each token's own KL penalty to that token's return "
                  "(remax_trainer.py compute_returns); the shared spec sums the penalties from that token on "
                  "(reward-to-go)"},
        {"key": "reward.clip", "shared": None, "effective": [-5.0, 5.0],
         "cause": "reward - baseline is clipped to +-5, hard-coded (self.clip_reward_value = 5.0; the "
                  "--clip_reward_value flag is ignored); inactive while |reward - baseline| <= 5"},
        {"key": "reward.kind", "shared": config["reward"]["kind"], "effective": config["reward"]["kind"],
         "cause": "the launcher replaces DeepSpeed-Chat's reward engine with the shared reward (a reward model is "
                  "scored by the shared reward server, not loaded by DeepSpeed-Chat; --reward_model_name_or_path is "
                  "required by the parser and unused)"},
        {"key": "task.prompt", "shared": "prompt", "effective": "prompt",
         "cause": "DeepSpeed-Chat's local/jsonfile reader prepends ' ' to every prompt; the launcher drops it so the "
                  "policy sees the shared prompt's tokens"},
        {"key": "optimizer", "shared": "AdamW", "effective": "AdamW betas (0.9, 0.95), weight decay 0 (FusedAdam)",
         "cause": "betas hard-coded in rlhf_engine.py _init_actor"},
        {"key": "rollout.short_responses", "shared": "scored and trained as sampled",
         "effective": "first token replaced by the tokenizer's encode(' ')[-1]",
         "cause": "remax_trainer.py _generate_sequence rewrites every sampled and greedy response with at most one "
                  "non-pad token before it is scored and trained, so an EOS drawn first is never penalized: with "
                  "ReMax's mostly negative advantages its probability only grows. On the cpu-frameworks profile "
                  "(p(EOS first) 0.7% after the short SFT) this ends learning within 40-70 steps; the same run "
                  "with that one line disabled gains as the reference does (docs/frameworks-on-cpu.md)"},
    ]
    if rc["temperature"] != 1.0:
        out.append({"key": "remax.temperature", "shared": rc["temperature"], "effective": 1.0,
                    "cause": "hard-coded in remax_trainer.py _generate_sequence (temperature=1.0)"})
    if rc["top_p"] != 0.9:
        out.append({"key": "remax.top_p", "shared": rc["top_p"], "effective": 0.9,
                    "cause": "hard-coded in remax_trainer.py _generate_sequence (top_p=0.9, also passed to the greedy "
                             "generation, where it has no effect)"})
    if rc["grad_clip"] != 1.0:
        out.append({"key": "remax.grad_clip", "shared": rc["grad_clip"], "effective": 1.0,
                    "cause": "hard-coded in utils/ds_utils.py get_train_ds_config (gradient_clipping 1.0)"})
    if dc["gamma"] != 1.0:
        out.append({"key": "dschat.gamma", "shared": 1.0, "effective": dc["gamma"],
                    "cause": "--gamma discounts the clipped reward by gamma per token, the last token included "
                             "(returns_t = gamma^(T-t+1) * clip(r - b) + kl_t); the shared spec has no discount"})
    return out


def _hyperparameters(config: dict, seed: int, settings: dict) -> list[dict]:
    rc = config["remax"]

    def h(key: str, shared: object, framework_key: str, effective: object) -> dict:
        return {"key": key, "shared": shared, "framework_key": framework_key, "effective": effective}

    return [
        h("remax.steps", rc["steps"], f"--enable_test_mode --test_stop_step, in one epoch over the training split "
          f"exported {settings['passes']} time(s)", rc["steps"]),
        h("remax.train_batch_size", rc["train_batch_size"], "--per_device_generation_batch_size x GPUs",
          settings["per_device"] * settings["world"]),
        h("remax.rollout_n", rc["rollout_n"], "(one sample per prompt, fixed)", 1),
        h("remax.max_prompt_length", rc["max_prompt_length"], "--max_prompt_seq_len", rc["max_prompt_length"]),
        h("remax.max_response_length", rc["max_response_length"], "--max_answer_seq_len", rc["max_response_length"]),
        h("remax.generation_length", rc["generation_length"], "the launcher's --generation-length: fixed adds "
          "min_length = max_length to remax_trainer.py's hard-coded generate() arguments; natural leaves them",
          rc["generation_length"]),
        h("remax.temperature", rc["temperature"], "remax_trainer.py temperature (hard-coded)", 1.0),
        h("remax.top_p", rc["top_p"], "remax_trainer.py top_p (hard-coded)", 0.9),
        h("remax.lr", rc["lr"], "--actor_learning_rate (--lr_scheduler_type constant)", rc["lr"]),
        h("remax.kl_coef", rc["kl_coef"], "--kl_ctl", rc["kl_coef"]),
        h("remax.grad_clip", rc["grad_clip"], "ds_config gradient_clipping (hard-coded)", 1.0),
        h("seed", seed, "--seed (python, numpy, torch); prompt order: DistributedSampler's own seed 0", seed),
        h("launch.gpus_per_node", config["launch"]["gpus_per_node"], "deepspeed --num_gpus",
          config["launch"]["gpus_per_node"]),
    ]


def plan(config: dict, seed: int, out_dir: str | Path, inputs_dir: str | Path) -> None:
    from harness.inputs.task import read_dataset

    inputs = resolve_inputs(inputs_dir)
    dataset = read_dataset(inputs["dataset"]["path"])
    settings = _check_settings(config, len(dataset["train"]), len(dataset["eval"]))
    out_dir = Path(out_dir).resolve()
    policy = Path(inputs["policy"]["path"]).resolve()
    actor = out_dir / "actor"
    if "llama" in str(actor) and not (policy / "tokenizer.model").is_file():
        raise HarnessError(f"{actor}: DeepSpeed-Chat loads a slow LlamaTokenizer (tokenizer.model) for any path "
                           f"containing 'llama', and {policy} has none; plan into a directory without 'llama'")
    checkout = checkout_dir(config)
    served = inputs["reward"]["kind"] == "model" or bool(config[NAME]["reward_url"])
    reward = plan_record(inputs["reward"], "served" if served else "in-process")
    server = None
    if inputs["reward"]["kind"] == "model":
        host, port = _served_at(config)
        server = server_block(config, inputs_dir, reward, host=host, port=port)
    env = environment(get_adapter(NAME), config)
    assert env is not None  # DeepSpeed-Chat always runs in an environment of its own
    argv = build_argv(config, seed, settings, actor, Path(inputs["dataset"]["path"]).resolve(), reward, env)
    env_vars = {"HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                # torch >= 2.6 loads only weights by default; DeepSpeed-Chat caches its datasets as pickled objects
                **({"DS_ACCELERATOR": "cpu", "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"} if on_cpu(config) else {})}
    _, strict_env, determinism_record, strict_deviations = determinism(config, STRICT, NOT_STRICT)
    env_vars.update(strict_env)
    with atomic_path(out_dir, owner=plan_owner(NAME, seed)) as tmp:
        tmp.mkdir()
        _actor_dir(policy, tmp / "actor", actor)
        _export_data(dataset["train"] * settings["passes"], tmp / "data" / "train.json")
        _export_data(dataset["eval"], tmp / "data" / "eval.json")
        write_text(tmp / "launch.sh", launch_script(
            title=f"DeepSpeed-Chat / official ReMax (liziniu/ReMax {REMAX_COMMIT[:7]}), planned by "
                  f"`remax-bench plan {NAME}`",
            argv=argv, env_vars=env_vars, env_check=env_check(env, config, "deepspeed"),
            checks=_checkout_check(checkout), setup=_RUN_LAYOUT, reward_server=server))
        write_json(tmp / "plan.json", {
            "framework": NAME,
            "framework_version": framework_version(env),
            "seed": seed,
            "run_id": run_id(NAME, config, seed),
            "env": env,
            "device": config["launch"]["device"],
            "argv": argv,
            "argv_note": f"{RUN_DIR} stands for the run directory given to launch.sh"
                         + (f", {REWARD_URL} for the reward server it starts" if server else ""),
            "env_vars": env_vars,
            "n_gpus": 0 if on_cpu(config) else settings["world"],
            "inputs": inputs,
            "checkout": {"path": str(checkout), "repository": config[NAME]["repository"], "commit": REMAX_COMMIT},
            "batches_per_epoch": settings["batches"],
            "hyperparameters": _hyperparameters(config, seed, settings),
            "deviations": _deviations(config) + (CPU_DEVIATIONS if on_cpu(config) else [])
                          + ([CPU_BF16] if on_cpu(config) and not config[NAME]["bf16"] else []) + strict_deviations,
            "determinism": determinism_record,
            "reward": reward,
        })


# ---- ingest --------------------------------------------------------------------------------------------------

_F = r"-?(?:\d+\.\d+|inf|nan)"  # an f-string float with :.2f
_X = r"[-+]?(?:\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|inf|nan)"  # a float printed with its repr
# step3_rlhf_finetuning/perf.py print_throughput_step3 and main.py's reward line, at liziniu/ReMax 536ba49.
PRINTED = {
    "e2e": ("End-to-End =>", re.compile(
        rf"End-to-End => Latency: (?P<e2e>{_F})s, TFLOPs: {_F}, Samples/sec: (?P<samples_per_s>{_F}), "
        rf"Time/seq {_F}s, Batch Size: (?P<batch>\d+), Total Seq\. Length: (?P<seq_len>\d+)")),
    "gen": ("Generation =>", re.compile(
        rf"Generation => Latency: (?P<gen>{_F})s, Per-token Latency {_F} ms, TFLOPs: {_F}, BW: {_F} GB/sec, "
        rf"Answer Seq\. Length: (?P<answer_len>\d+)")),
    "train": ("Training   =>", re.compile(rf"Training   => Latency: (?P<train>{_F})s, TFLOPs: {_F}")),
    "reward": ("Average reward score:", re.compile(
        rf"Average reward score: (?P<reward>{_X}) Average return: {_X} Average length: (?P<length>-?\d+) "
        rf"Average kl: {_X} Average entropy: {_X} Max kl: {_X} Max return: {_X} KL ratio: {_X}")),
}
_ORDER = ("e2e", "gen", "train", "reward")
_PREFIX = re.compile(r"^(?:[\w.\-]+: )?")  # a multi-node launcher's "host: " prefix


def parse_printed(path: Path) -> list[dict]:
    """DeepSpeed-Chat's per-step printed lines -> one dict per step (in order); garbled lines raise.

    Per step main.py prints End-to-End, Generation, Training (perf.py), then the Average reward line.
    """
    steps: list[dict] = []
    with open(path, errors="replace") as f:
        for lineno, raw in enumerate(f, 1):
            line = raw.rstrip("\n")
            prefix = _PREFIX.match(line)  # matches every line (the prefix is optional)
            body = line[prefix.end() if prefix else 0:].rstrip()
            kind = next((k for k, (start, _) in PRINTED.items() if body.startswith(start)), None)
            if kind is None:
                continue
            m = PRINTED[kind][1].fullmatch(body)
            if m is None:
                raise HarnessError(f"{path}:{lineno}: garbled DeepSpeed-Chat line (not in perf.py/main.py's format): "
                                   f"{line[:200]!r}")
            seen = list(steps[-1]) if steps else []
            follows = (kind == "e2e" and (not seen or len(seen) >= 3)) or seen == list(_ORDER[:_ORDER.index(kind)])
            if not follows:
                raise HarnessError(f"{path}:{lineno}: {PRINTED[kind][0]!r} line out of order (after "
                                   f"{', '.join(PRINTED[k][0] for k in seen) or 'nothing'} in this step)")
            if kind == "e2e":
                steps.append({})
            steps[-1][kind] = {k: float(v) for k, v in m.groupdict().items()}
    if steps and len(steps[-1]) < 3:
        raise HarnessError(f"{path}: the last step's printed lines are incomplete (the run stopped mid-print)")
    return steps


def _printed_row(step: int, block: dict, n_gpus: int) -> dict:
    e2e, gen, train = block["e2e"], block["gen"], block["train"]
    batch, answer = e2e["batch"], gen["answer_len"]
    reward = block.get("reward", {})
    return {
        "step": step, "n_gpus": n_gpus,
        # DeepSpeed-Chat's End-to-End latency is generation + training only (main.py: "it is an approximation").
        "time_step_s": e2e["e2e"], "time_gen_s": gen["gen"], "time_transition_s": math.nan,
        "time_train_s": train["train"],
        # Estimated as DeepSpeed-Chat's own throughput assumes: every sequence at the configured maximum lengths.
        "tokens_prompt": batch * (e2e["seq_len"] - answer), "tokens_response": batch * answer,
        "tokens_baseline": batch * answer,
        "reward_mean": reward.get("reward", math.nan), "reward_baseline_mean": math.nan,
        # main.py's "Average kl" is a per-token mean, not the schema's per-response sum: not used.
        "kl_mean": math.nan,
        # main.py counts the action mask from the last prompt token on: one more than the response's tokens.
        "response_length_mean": reward["length"] - 1 if "length" in reward else math.nan,
        metrics.FRAMEWORK_THROUGHPUT: e2e["samples_per_s"] * e2e["seq_len"],
        ESTIMATED: True,
    }


def _read_json_lines(path: Path) -> list[dict]:
    rows = []
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise HarnessError(f"{path}:{lineno}: not a JSON step record ({e.msg})") from None
            missing = [k for k in ("step", "time_step_s", "tokens_prompt", "tokens_response") if k not in row] \
                if isinstance(row, dict) else ["a JSON object"]
            if missing:
                raise HarnessError(f"{path}:{lineno}: step record lacks {', '.join(missing)}")
            rows.append(row)
    return rows


def _is_json_lines(path: Path) -> bool:
    with open(path, errors="replace") as f:
        first = next((line for line in f if line.strip()), "")
    return first.lstrip().startswith("{")


def evaluation(run_dir: Path) -> dict | None:
    """Eval greedy accuracy before and after training: the launcher's greedy evaluation of the initial and the saved
    actor (dschat_launcher.greedy_evaluation; DeepSpeed-Chat itself evaluates sampled rewards only)."""
    path = Path(run_dir) / dschat_launcher.EVAL_LOG
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
        points = {k: {"greedy_accuracy": float(record[k]["greedy_accuracy"]),
                      "reward_mean": float(record[k]["reward_mean"])} for k in ("before", "after")}
        if "responses" in record["before"]:
            points["before"]["responses"] = record["before"]["responses"]
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        raise HarnessError(f"{path}: not the launcher's evaluation record ({e!r})") from None
    return {"run_id": run_plan(path, NAME)["run_id"], "split": "eval",
            "source": "greedy decoding of the initial and the saved actor by the launcher (Transformers generate)",
            **points}


def ingest(logs: Sequence[Path], n_gpus: int | None = None) -> pd.DataFrame:
    """The launcher's JSON lines (measured) with DeepSpeed-Chat's printed figure beside them; printed lines alone
    give estimated rows (`tokens_estimated`). Logs of one run directory belong together (same plan.json)."""
    by_run: dict[Path, dict] = {}
    for path in map(Path, logs):
        entry = by_run.setdefault(path.parent, {"json": [], "printed": [], "paths": []})
        entry["paths"].append(path)
        (entry["json"] if _is_json_lines(path) else entry["printed"]).append(path)
    frames = []
    for entry in by_run.values():
        ident = {k: v for k, v in run_plan(entry["paths"][0], NAME).items() if k in PLAN_IDENTITY}
        planned_gpus = ident.pop("n_gpus")
        gpus = n_gpus if n_gpus is not None else planned_gpus or 0
        printed = [b for p in entry["printed"] for b in parse_printed(p)]
        if entry["json"]:
            rows = [r for p in entry["json"] for r in _read_json_lines(p)]
            for i, r in enumerate(rows):
                r[ESTIMATED] = False
                if n_gpus is not None:
                    r["n_gpus"] = n_gpus
                if i < len(printed):  # DeepSpeed-Chat prints one block per step, after the step
                    e2e = printed[i]["e2e"]
                    r[metrics.FRAMEWORK_THROUGHPUT] = e2e["samples_per_s"] * e2e["seq_len"]
        else:
            rows = [_printed_row(i, b, gpus) for i, b in enumerate(printed, 1)]
        for r in rows:
            r.update(ident)
        source = ", ".join(map(str, entry["paths"]))
        df = metrics.to_frame(rows, source)
        flags = {int(r["step"]): bool(r[ESTIMATED]) for r in rows}
        df[ESTIMATED] = df["step"].map(flags).astype(bool)
        frames.append(df)
    if not frames:
        raise HarnessError("no DeepSpeed-Chat logs given")
    return pd.concat(frames, ignore_index=True)


# ---- conformance ---------------------------------------------------------------------------------------------

# Beyond the shared vectors: the two settings that make DeepSpeed-Chat's ReMax differ where the shared cases
# cannot show it (the rule reward stays within [0, 1], and the shared spec has no discount).
EXTRA_CASES = {
    "dschat:reward_beyond_clip": {
        "description": "reward - baseline beyond +-5 (a reward model's scale): DeepSpeed-Chat clips it",
        "mask": [[1, 1, 1, 0], [1, 1, 0, 0]],
        "scores": [8.0, -7.0],
        "baselines": [0.5, 0.0],
        "kl": [[0.0] * 4] * 2,
        "kl_coef": 0.0,
    },
}
OFFICIAL_GAMMA = 0.99  # training_scripts/llama2/run_llama2_7b.sh at 536ba49


def conformance_cases(config_gamma: float = 1.0) -> dict[str, tuple[dict, float]]:
    from harness.conformance import CASES

    cases = {name: (case, config_gamma) for name, case in {**CASES, **EXTRA_CASES}.items()}
    cases["outcome@gamma_0.99"] = (CASES["outcome"], OFFICIAL_GAMMA)
    return cases


CONFORMANCE_DRIVER = Path(__file__).with_name("conformance_driver.py")


def conformance(config: dict | None = None) -> pd.DataFrame:
    """ReMax's own returns (the weights of log-probs in its loss) vs the reference advantage, per vector.

    Runs DeepSpeedReMaxTrainer.compute_loss from the pinned checkout in the dschat CPU environment; without the
    checkout every row says so (verdict "not run"), nothing is computed in its place.
    """
    import torch

    from harness.conformance import reference_advantages
    from harness.conformance import verdict as conformance_verdict

    gamma = float((config or {}).get(NAME, {}).get("gamma", 1.0))
    cases = conformance_cases(gamma)
    try:
        checkout = require_checkout(checkout_dir(config))
    except HarnessError as e:
        return pd.DataFrame([{"framework": NAME, "case": name, "max_abs_diff": math.nan, "verdict": "not run",
                              "note": str(e)} for name in cases])
    payload: dict[str, dict[str, Any]] = {name: {"case": case, "gamma": g,
                      "scores": case.get("scores") or [sum(r) for r in case["token_scores"]]}
               for name, (case, g) in cases.items()}
    proc = subprocess.run([str(ensure_env(CPU_ENV)), str(CONFORMANCE_DRIVER), str(checkout)],
                          input=json.dumps(payload), capture_output=True, text=True,
                          env={**os.environ, "DS_ACCELERATOR": "cpu", "PYTHONPATH": ""})
    if proc.returncode:
        raise HarnessError(f"{checkout}: running ReMax's compute_loss failed:\n{proc.stderr[-3000:]}")
    theirs = json.loads(proc.stdout.strip().splitlines()[-1])
    rows = []
    for name, (case, g) in cases.items():
        ref = reference_advantages(case)
        diff = float((torch.tensor(theirs[name]["returns"]) - ref).abs().max())
        notes = []
        if case["kl_coef"] and any(any(v for v in row) for row in case["kl"]):
            notes.append("per-token KL in the return at that token only (reference: KL summed to go)")
        if "token_scores" in case:
            notes.append("one score per response (the dense scores summed, applied at the end)")
        if any(abs(s - b) > theirs[name]["clip"] for s, b in zip(payload[name]["scores"], case["baselines"])):
            notes.append(f"reward - baseline clipped to +-{theirs[name]['clip']:g}")
        if g != 1.0:
            notes.append(f"gamma {g:g}: clipped reward discounted by gamma^(T-t+1)")
        verdict = conformance_verdict(diff)
        rows.append({"framework": NAME, "case": name, "max_abs_diff": diff, "verdict": verdict,
                     "note": "; ".join(notes) if verdict == "differs" else ""})
    return pd.DataFrame(rows)


# Read in the official ReMax code at REMAX_COMMIT.
register_framework(Adapter(
    name=NAME,
    one_node="the deepspeed launcher needs a hostfile of the nodes for more, which this adapter does not write",
    description="DeepSpeed-Chat: the official ReMax code (liziniu/ReMax 536ba49) under the deepspeed launcher, "
                "timed and scored by the harness launcher",
    ingest=ingest,
    evaluation=evaluation,
    log_glob="*.log",
    plan=plan,
    env=ENV,
    cpu_env=CPU_ENV,
    check_env=CPU_ENV,
    own_throughput="perf.py's Samples/sec x Total Seq. Length: the configured maximum prompt + answer length, not "
                   "the tokens generated, over its End-to-End latency (time.time() without device sync); above the "
                   "harness's figure whenever answers stop before the maximum",
    conformance=conformance,
    module="deepspeed",
    saves_checkpoint=True,  # the final actor, to --output_dir in the run directory
    schema=Path(__file__).with_name("config.schema.yaml"),
    image=Path(__file__).with_name("image.yaml"),
    checkout=Checkout(REMAX_COMMIT, REMAX_FOLDERS),
    ports=lambda config: [("dschat.master_port", "127.0.0.1", config[NAME]["master_port"])],
))
