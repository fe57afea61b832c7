"""The DeepSpeed-Chat plan: a launch directory for `step3_rlhf_finetuning/main.py --algo remax` under the `deepspeed`
launcher, run through the harness's launcher (inside/launcher.py, which times DeepSpeed's hybrid engine and scores
with the shared reward); the shared dataset exported in DeepSpeed-Chat's `local/jsonfile` layout; settings the code
breaks on refused up front; the pinned checkout checked before it is planned and again by launch.sh before it runs.
"""

from __future__ import annotations

import ast
import itertools
import json
import math
import os
from pathlib import Path

from harness import HarnessError
from harness.checkpoint import checkpoint_config
from harness.frameworks.determinism import Knob, determinism
from harness.frameworks.registry import environment, get_adapter, on_cpu, run_id, write_plan
from harness.frameworks.reward_serving import plan_record, server_block
from harness.inputs import resolve_inputs
from harness.io import atomic_path, write_text
from harness.results.layout import plan_owner
from harness.runtime.container import env_check, env_command
from harness.runtime.envs import pinned_version
from harness.runtime.git import SAFE_CONFIG
from harness.runtime.git import run as run_git
from harness.runtime.launch_script import (
    LAUNCH_SCRIPT_ROLE,
    REWARD_URL,
    RUN_DIR,
    fill,
    launch_script,
    shell_word,
)
from harness.runtime.locks import package_deviations

NAME = "dschat"
ENV = "dschat"  # envs/dschat.txt: the GPU run environment
CPU_ENV = "dschat-cpu"  # envs/dschat-cpu.txt: real DeepSpeed on the CPU, for CPU runs and checks
REMAX_COMMIT = "536ba49cc2f9a1a76941045388a44757e2533e75"
MAIN = "step3_rlhf_finetuning/main.py"
TEMPLATES = Path(__file__).with_name("templates")  # launch.sh fragments
CHECKOUT_ENV = "REMAX_BENCH_REMAX_CHECKOUT"  # where conformance (which has no config) finds the checkout
STEPS_LOG = "dschat_steps.log"  # the launcher's JSON lines, in the run directory
LAUNCHER = Path(__file__).with_name("inside") / "launcher.py"  # runs in DeepSpeed-Chat's environment: never imported


def _launcher_constants() -> dict:
    """The launcher's literal module-level constants, read from its source: the harness names the code that runs in
    DeepSpeed-Chat's environment by path and never imports it (tests/test_code_style.py)."""
    out = {}
    for node in ast.parse(LAUNCHER.read_text()).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                out[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                continue
    return out


_CONSTANTS = _launcher_constants()
LAUNCHER_OPTIONS: tuple[str, ...] = _CONSTANTS["LAUNCHER_OPTIONS"]  # the launcher's own options, one value each
EVAL_LOG: str = _CONSTANTS["EVAL_LOG"]  # the launcher's greedy evaluation record, beside its steps log
DETERMINISTIC_ENV: str = _CONSTANTS["DETERMINISTIC_ENV"]  # set: the launcher applies torch's determinism switches
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
    head = run_git(path, "rev-parse", "HEAD").stdout.strip()
    if head != REMAX_COMMIT:
        raise HarnessError(f"{path}: checkout is at {head or 'no git commit'}, not the pinned {REMAX_COMMIT}")
    edited = _local_changes(path)
    if edited:
        raise HarnessError(f"{path}: the pinned ReMax checkout has local changes ({edited}); it is no longer the "
                           "official code")
    return path


def _local_changes(path: Path) -> str:
    """Tracked files changed in the checkout (git status --porcelain), '' when it is clean."""
    return run_git(path, "status", "--porcelain", "--untracked-files=no").stdout.strip().replace("\n", "; ")


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
    cfg = checkpoint_config(policy, "policy config")
    dest.mkdir()
    for f in sorted(policy.iterdir()):
        if f.name != "config.json":
            (dest / f.name).symlink_to(f.resolve())
    cfg["_name_or_path"] = str(final)
    (dest / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")


DATA_ROLE = "DeepSpeed-Chat dataset"  # what _export_data writes (harness.io.WRITTEN)


def _export_data(rows: list[dict], dest: Path) -> int:
    """DeepSpeed-Chat's local/jsonfile rows (JSON lines): prompt, chosen (the answer), rejected (none exists)."""
    write_text(dest, "".join(json.dumps({"prompt": r["prompt"], "chosen": r["answer"], "rejected": None}) + "\n"
                             for r in rows), role=DATA_ROLE)
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


# How a CPU run (launch.device cpu) differs from the GPU plan: the launcher's CPU layer (install_cpu_layer of
# inside/launcher.py) and the settings DeepSpeed's cpu accelerator needs. In plan.json's deviations, each cause starting
# "CPU run:" as every adapter's CPU stand-ins do (the report's fairness summary counts them by it).
CPU_DEVIATIONS = [
    {"key": "device", "shared": "the node's GPUs", "effective": "one process on DeepSpeed's cpu accelerator (gloo)",
     "cause": "CPU run: the ReMax code's torch.cuda.set_device, .cuda() and to_device(batch, cuda) go to the CPU "
              "(dschat_launcher.install_cpu_layer); DeepSpeed 0.19.8 and Transformers 5 (harness/frameworks/dschat/"
              "envs/dschat-cpu.txt), not the 0.10.3 and 4.31 of the GPU environment, which have no CPU path"},
    {"key": "generation", "shared": "DeepSpeed's hybrid engine with its inference kernels",
     "effective": "the hybrid engine around the model's own generate()",
     "cause": "CPU run: DeepSpeed's inference containers for a Llama policy are CUDA kernels; on the CPU the hybrid "
              "engine builds none and generates with Transformers, as it does for a model it has no policy for"},
    {"key": "optimizer", "shared": "FusedAdam", "effective": "torch.optim.AdamW, the same arguments",
     "cause": "CPU run: FusedAdam is a CUDA op; torch's AdamW makes the same update"},
]
CPU_BF16 = {"key": "dschat.bf16", "shared": False, "effective": True,
            "cause": "CPU run: DeepSpeed-Chat trains in fp16 unless --actor_bf16, and DeepSpeed's cpu accelerator has "
                     "no fp16"}


# reproducibility.determinism strict. The ReMax code and DeepSpeed 0.19.8 have no determinism switch (main.py's --seed,
# always planned, seeds python, numpy and torch: utils/utils.py:102-108); torch's own switches are applied by the
# harness's launcher before main.py runs.
STRICT = [Knob("torch.use_deterministic_algorithms(True), cuDNN deterministic, CUBLAS_WORKSPACE_CONFIG=:4096:8",
               "nondeterministic torch kernels raise instead of running; set by the harness's launcher, in main.py's "
               "process",
               "dschat/inside/launcher.py main (DETERMINISTIC_ENV); torch/__init__.py:1388 (PyTorch 2.13)",
               env={"CUBLAS_WORKSPACE_CONFIG": ":4096:8", DETERMINISTIC_ENV: "1"})]
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
    while i < len(argv) and argv[i] in LAUNCHER_OPTIONS:
        i += 2
    return argv[i:]


def _checkout_check(checkout: Path) -> str:
    """launch.sh's check: refuse a checkout that is not the pinned, unedited official code."""
    return fill(TEMPLATES / "checkout_check.sh.j2", checkout=shell_word(str(checkout)), commit=REMAX_COMMIT,
                git=" ".join(map(shell_word, ["git", *SAFE_CONFIG])))


# DeepSpeed-Chat reads local/jsonfile data from data/ beside the checkout (utils/data/data_utils.py).
RUN_LAYOUT = TEMPLATES / "run_layout.sh.j2"


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
            checks=_checkout_check(checkout), setup=fill(RUN_LAYOUT), reward_server=server), role=LAUNCH_SCRIPT_ROLE)
        write_plan(tmp / "plan.json", {
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
            "deviations": _deviations(config) + (CPU_DEVIATIONS + package_deviations(NAME, TEMPLATES.with_name("envs"))
                                                 if on_cpu(config) else [])  # CPU packages against the GPU lock's
                          + ([CPU_BF16] if on_cpu(config) and not config[NAME]["bf16"] else []) + strict_deviations,
            "determinism": determinism_record,
            "reward": reward,
        }, config)
