"""Runs the official ReMax code (DeepSpeed-Chat step 3, `main.py --algo remax`) and measures what it leaves out.

Started by the `deepspeed` launcher in the dschat environment, once per rank, as a script:

    deepspeed --num_gpus N dschat_launcher.py --main MAIN.py --steps-log LOG --dataset DATASET.jsonl
        [--reward-url URL] [--generation-length natural|fixed] [--greedy-eval on|off] MAIN.py's own arguments...

(every argument that is not the launcher's, and the `--local_rank=R` that the `deepspeed` launcher inserts, goes to
main.py; main.py's flags are spelt with underscores, the launcher's with hyphens, and none is abbreviated). It is a
script, not a module of the harness package: the dschat environment holds DeepSpeed 0.10.3 and transformers 4.31, not
the harness's dependencies, so the launcher imports only `harness.reward` (no dependencies) from the harness, through
its reward client (reward_client.py, beside it). That one is imported by its file name, from this folder: the
script's own, on sys.path where the launcher runs. The harness reads its options and constants from this file's
source and never imports it (harness.frameworks.dschat.plan); the tests import it without this folder on sys.path,
so reward_client is imported inside the functions that only run in the dschat environment.

Before main.py runs (with `runpy`, as `__main__`), it

* wraps DeepSpeed's `DeepSpeedHybridEngine.eval/train/generate/step` on the class, before `deepspeed.initialize`
  builds the actor, so the engine that main.py gets is timed; the device is synchronized before and after each
  call. DeepSpeed-Chat times none of the train->generate switch and prints throughput from configured maximum
  lengths; these wrappers measure the switch (`eval()`, and the ZeRO-3 parameter gather inside `generate`, which
  DeepSpeed itself reports as `_gather_latency`), sampled and greedy generation apart, and the actual tokens;
  with `--generation-length fixed` it adds `min_length = max_length` to remax_trainer.py's generate() call (whose
  arguments are hard-coded), so Transformers masks EOS until every response has --max_answer_seq_len tokens;
* wraps `DeepSpeedReMaxTrainer.generate_experience` to know where a training iteration starts (evaluation
  rollouts, `training_mode=False`, are not steps) and what its rollout scored;
* replaces DeepSpeed-Chat's reward model (`DeepSpeedRLHFEngine._init_reward`) with the shared reward
  (reward_client.SharedReward), `harness.reward.score` (or the shared reward server at `--reward-url`, which is how
  a shared reward model scores: launch.sh starts the server on the checkpoint), so DeepSpeed-Chat is scored by the
  same code as every other framework; DeepSpeed-Chat loads no reward model;
* drops the " " that DeepSpeed-Chat's `local/jsonfile` reader puts before every prompt, so the policy sees the
  shared prompt's own tokens.

Rank 0 writes one JSON line per optimizer step to `--steps-log` (counts summed and times maximised over ranks) and,
with `--greedy-eval on`, evaluates the initial and the saved actor after main.py (reward_client.greedy_evaluation).
"""

from __future__ import annotations

import argparse
import json
import os
import runpy
import sys
import time
import types
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the dschat environment's packages, for annotations only: nothing here is imported at run time
    import torch
    from deepspeed.runtime.hybrid_engine import DeepSpeedHybridEngine
    from remax_trainer import DeepSpeedReMaxTrainer
    from rlhf_engine import DeepSpeedRLHFEngine
    from transformers import PreTrainedTokenizerBase

# The harness checkout this file lives in: reward_client imports `harness.reward` from it, whatever PYTHONPATH says.
sys.path.insert(0, str(Path(__file__).resolve().parents[4]))

_SUMMED = ("tokens_prompt", "tokens_response", "tokens_baseline", "n_samples", "reward_sum", "n_rewards",
           "baseline_sum", "n_baselines", "kl_sum", "n_kl")
_MAXED = ("time_step_s", "gen_sampled", "gen_greedy", "switch_to_generate", "switch_to_train", "gather",
          "experience", "train")


def _synchronized_now() -> float:
    from deepspeed.accelerator import get_accelerator

    get_accelerator().synchronize()
    return time.perf_counter()


def _stop_ids(module: torch.nn.Module, pad_token_id: int | None) -> set[int]:
    eos = getattr(getattr(module, "generation_config", None), "eos_token_id", None)
    ids = set(eos if isinstance(eos, (list, tuple)) else [eos] if eos is not None else [])
    if pad_token_id is not None:
        ids.add(int(pad_token_id))
    return ids


class StepRecorder:
    """Collects one training iteration's timings and counts from the wrapped calls; rank 0 writes its JSON line."""

    def __init__(self, steps_log: str | os.PathLike | None) -> None:
        self.steps_log = Path(steps_log) if steps_log else None
        self.step = 0
        self.window: dict | None = None

    # A window is one training iteration: from generate_experience(training_mode=True) to the optimizer step.
    def open(self) -> None:
        self.window = dict.fromkeys(_SUMMED + _MAXED, 0.0)
        self.window["t0"] = _synchronized_now()
        self.window["reward_calls"] = 0

    def add(self, key: str, value: float) -> None:
        if self.window is not None:
            self.window[key] += value

    def experience_done(self, t_end: float) -> None:
        w = self.window
        if w is not None:
            w["t1"] = t_end
            w["experience"] = (t_end - w["t0"] - w["gen_sampled"] - w["gen_greedy"] - w["switch_to_generate"]
                               - w["switch_to_train"])

    def close(self, t_end: float) -> dict | None:
        """End the window at the optimizer step; return (and on rank 0 write) the step's record."""
        w, self.window = self.window, None
        if w is None or "t1" not in w:
            return None
        w["train"] = t_end - w["t1"]
        w["time_step_s"] = t_end - w["t0"]
        summed, maxed, world = self._reduce([w[k] for k in _SUMMED], [w[k] for k in _MAXED])
        s, m = dict(zip(_SUMMED, summed)), dict(zip(_MAXED, maxed))
        self.step += 1
        from deepspeed.accelerator import get_accelerator

        record = {
            "step": self.step,
            "world_size": world,
            "n_gpus": world if get_accelerator().device_name() != "cpu" else 0,
            "time_step_s": m["time_step_s"],
            # Generation proper: the ZeRO-3 gather that DeepSpeed does inside generate() is the transition's.
            "time_gen_sampled_s": m["gen_sampled"],
            "time_gen_greedy_s": m["gen_greedy"],
            "time_gen_s": m["gen_sampled"] + m["gen_greedy"] - m["gather"],
            "time_switch_to_generate_s": m["switch_to_generate"],
            "time_switch_to_train_s": m["switch_to_train"],
            "time_gather_s": m["gather"],
            "time_transition_s": m["switch_to_generate"] + m["switch_to_train"] + m["gather"],
            "time_experience_s": m["experience"],
            "time_train_s": m["train"],
            "tokens_prompt": s["tokens_prompt"],
            "tokens_response": s["tokens_response"],
            "tokens_baseline": s["tokens_baseline"],
            "n_samples": s["n_samples"],
            "reward_mean": _mean(s["reward_sum"], s["n_rewards"]),
            "reward_baseline_mean": _mean(s["baseline_sum"], s["n_baselines"]),
            "kl_mean": _mean(s["kl_sum"], s["n_kl"]),
            "response_length_mean": _mean(s["tokens_response"], s["n_samples"]),
        }
        if self.steps_log is not None and _rank() == 0:
            with open(self.steps_log, "a") as f:
                f.write(json.dumps(record, sort_keys=True) + "\n")
        return record

    @staticmethod
    def _reduce(summed: list[float], maxed: list[float]) -> tuple[list[float], list[float], int]:
        import torch
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            return summed, maxed, 1
        from deepspeed.accelerator import get_accelerator

        device = get_accelerator().current_device_name()
        a = torch.tensor(summed, dtype=torch.float64, device=device)
        b = torch.tensor(maxed, dtype=torch.float64, device=device)
        dist.all_reduce(a, op=dist.ReduceOp.SUM)
        dist.all_reduce(b, op=dist.ReduceOp.MAX)
        return a.tolist(), b.tolist(), dist.get_world_size()


def _mean(total: float, n: float) -> float | None:
    return total / n if n else None  # JSON null: nothing of the kind was seen in this step


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def wrap_hybrid_engine(recorder: StepRecorder, engine_cls: type[DeepSpeedHybridEngine] | None = None,
                       fixed_length: bool = False) -> None:
    """Time DeepSpeedHybridEngine's eval/train/generate/step on the class (call before deepspeed.initialize);
    with fixed_length, every generate() call is held to its max_length (Transformers' min_length)."""
    from reward_client import response_lengths

    if engine_cls is None:
        from deepspeed.runtime.hybrid_engine import DeepSpeedHybridEngine

        engine_cls = DeepSpeedHybridEngine
    wrapped = ("eval", "train", "generate", "step", "create_inference_module")
    orig = {name: getattr(engine_cls, name) for name in wrapped}

    def eval_(self: DeepSpeedHybridEngine) -> None:
        t = _synchronized_now()
        out = orig["eval"](self)
        recorder.add("switch_to_generate", _synchronized_now() - t)
        return out

    def train_(self: DeepSpeedHybridEngine, mode: bool = True) -> None:
        t = _synchronized_now()
        out = orig["train"](self, mode)
        # Only the switch back after this iteration's generation counts; main.py also calls train() elsewhere.
        if mode and recorder.window is not None and "t1" not in recorder.window:
            recorder.add("switch_to_train", _synchronized_now() - t)
        return out

    def generate(self: DeepSpeedHybridEngine, *inputs: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        prompt = inputs[0] if inputs else kwargs["input_ids"]
        if fixed_length:
            kwargs = {**kwargs, "min_length": kwargs["max_length"]}
        t = _synchronized_now()
        seq = orig["generate"](self, *inputs, **kwargs)
        elapsed = _synchronized_now() - t
        if recorder.window is not None:
            sampled = bool(kwargs.get("do_sample", False))
            recorder.add("gen_sampled" if sampled else "gen_greedy", elapsed)
            recorder.add("gather", float(getattr(self, "_gather_latency", 0.0) or 0.0))
            lengths = response_lengths(seq[:, prompt.shape[1]:], _stop_ids(self.module, kwargs.get("pad_token_id")))
            mask = kwargs.get("attention_mask")
            if sampled:
                recorder.add("tokens_prompt", float(mask.sum()) if mask is not None else float(prompt.numel()))
                recorder.add("tokens_response", float(sum(lengths)))
                recorder.add("n_samples", float(len(lengths)))
            else:
                recorder.add("tokens_baseline", float(sum(lengths)))
        return seq

    def step(self: DeepSpeedHybridEngine, *args: Any, **kwargs: Any) -> None:
        out = orig["step"](self, *args, **kwargs)
        recorder.close(_synchronized_now())
        return out

    def create_inference_module(self: DeepSpeedHybridEngine) -> None:
        orig["create_inference_module"](self)
        # DeepSpeed routes the module's generate() through the engine only when it built inference containers
        # for the model; otherwise generation runs the model's own generate() and the engine never sees it.
        # Route it the same way here so that both paths are timed (the engine's generate() then only does its
        # bookkeeping around the model's own generate()).
        if not self._inference_containers:
            self._generate = self.module.generate
            self.module.generate = self.generate

    engine_cls.eval, engine_cls.train, engine_cls.generate, engine_cls.step = eval_, train_, generate, step
    engine_cls.create_inference_module = create_inference_module


def wrap_trainer(recorder: StepRecorder, trainer_cls: type[DeepSpeedReMaxTrainer]) -> None:
    """Mark training iterations (generate_experience with training_mode=True) and measure their KL."""
    orig = trainer_cls.generate_experience

    def generate_experience(self: DeepSpeedReMaxTrainer, prompts: torch.Tensor, mask: torch.Tensor, step: int,
                            print_answers: bool = False, training_mode: bool = True) -> dict[str, torch.Tensor | None]:
        if training_mode:
            recorder.open()
        out = orig(self, prompts, mask, step, print_answers=print_answers, training_mode=training_mode)
        if training_mode:
            recorder.experience_done(_synchronized_now())
            kl = sequence_kl(out["logprobs"], out["ref_logprobs"], out["attention_mask"], prompts.shape[1])
            recorder.add("kl_sum", float(kl.sum()))
            recorder.add("n_kl", float(kl.numel()))
        return out

    trainer_cls.generate_experience = generate_experience


def sequence_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, attention_mask: torch.Tensor,
                prompt_length: int) -> torch.Tensor:
    """Per response: sum over its tokens of log p - log p_ref (k1), the common schema's kl_mean before the mean.

    logprobs[:, t] scores token t + 1 (DeepSpeed-Chat's gather_log_probs on logits[:, :-1]).
    """
    start = prompt_length - 1
    diff = (logprobs[:, start:] - ref_logprobs[:, start:]).float()
    return (diff * attention_mask[:, prompt_length:].to(diff.dtype)).sum(-1)


def install_cpu_layer() -> None:
    """Run the CUDA-only parts of DeepSpeed-Chat's step 3 on DeepSpeed's cpu accelerator (DS_ACCELERATOR=cpu).

    The ReMax code pins a CUDA device per rank (main.py), moves tensors with .cuda() (remax_trainer.py's
    print_all_ranks, data_utils.py's cache flag) and to_device(batch, cuda) (main.py), builds the actor's optimizer
    as FusedAdam (a CUDA op), and DeepSpeed's hybrid engine builds CUDA inference kernels for a Llama policy. Here
    the device is the CPU, the optimizer torch's AdamW (FusedAdam's update, same arguments), and generation the
    model's own generate(), as the hybrid engine does for a model it has no inference policy for. Transformers 5
    keeps `transformers.deepspeed` (which the ReMax code imports, written for 4.31) under `integrations`, and the
    optimizer leaves out the empty parameter group that torch 2.0 tolerated and torch 2.13's scheduler does not.
    """
    import torch
    import transformers.integrations.deepspeed
    from deepspeed.runtime.hybrid_engine import DeepSpeedHybridEngine

    sys.modules.setdefault("transformers.deepspeed", transformers.integrations.deepspeed)
    cpu = torch.device("cpu")
    torch.cuda.set_device = lambda device: None
    torch.Tensor.cuda = lambda self, *args, **kwargs: self.to(cpu)  # type: ignore[method-assign]  # the CPU layer

    import rlhf_engine
    import utils.utils

    to_device = utils.utils.to_device
    utils.utils.to_device = lambda batch, device: to_device(batch, cpu)

    def adamw(params: list[dict[str, Any]], lr: float, betas: tuple[float, float],
              **kwargs: Any) -> torch.optim.AdamW:
        # Without LoRA one of the ReMax code's parameter groups is empty; ZeRO drops it from the optimizer, and
        # torch >= 2.6's scheduler (strict zip) then fails on the group count; torch 2.0's ignored the mismatch.
        return torch.optim.AdamW([g for g in params if g["params"]], lr=lr, betas=betas)

    rlhf_engine.FusedAdam = adamw

    # save_hf_format ends with tokenizer.save_vocabulary, which a Transformers 5 fast tokenizer without a vocab
    # file cannot do; save_pretrained writes the same tokenizer files.
    save_hf_format = utils.utils.save_hf_format

    def save_hf_format_t5(model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, args: argparse.Namespace,
                          sub_folder: str = "") -> None:
        save_hf_format(model, types.SimpleNamespace(save_vocabulary=tokenizer.save_pretrained), args, sub_folder)

    utils.utils.save_hf_format = save_hf_format_t5
    DeepSpeedHybridEngine.create_inference_containers = lambda self, module, layer_id=0: None


def install(recorder: StepRecorder, dataset: str, reward_url: str | None, fixed_length: bool = False) -> None:
    """Patch DeepSpeed and the ReMax modules (importable from sys.path) before main.py runs."""
    from deepspeed.accelerator import get_accelerator

    if get_accelerator().device_name() == "cpu":
        install_cpu_layer()
    import remax_trainer
    import rlhf_engine
    from reward_client import SharedReward
    from utils.data import raw_datasets

    wrap_hybrid_engine(recorder, fixed_length=fixed_length)
    wrap_trainer(recorder, remax_trainer.DeepSpeedReMaxTrainer)

    def init_reward(self: DeepSpeedRLHFEngine, reward_model_name_or_path: str) -> SharedReward:
        return SharedReward(self.tokenizer, dataset, recorder, reward_url)

    rlhf_engine.DeepSpeedRLHFEngine._init_reward = init_reward

    local = raw_datasets.LocalJsonFileDataset
    local.get_prompt = lambda self, sample: sample["prompt"]
    local.get_prompt_and_chosen = lambda self, sample: (
        None if sample["chosen"] is None else sample["prompt"] + sample["chosen"])


LAUNCHER_OPTIONS = ("--main", "--steps-log", "--dataset", "--reward-url", "--generation-length",
                    "--greedy-eval")  # one value each


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """The launcher's own options; everything else (with the launcher-inserted --local_rank) is main.py's."""
    p = argparse.ArgumentParser(prog="dschat_launcher", allow_abbrev=False)
    p.add_argument("--main", required=True, help="step3_rlhf_finetuning/main.py of the ReMax checkout")
    p.add_argument("--steps-log", required=True, help="JSON lines, one per optimizer step (rank 0)")
    p.add_argument("--dataset", required=True, help="the shared dataset (JSONL with prompt and answer)")
    p.add_argument("--reward-url", default=None, help="shared reward server; default: harness.reward.score here")
    p.add_argument("--generation-length", choices=("natural", "fixed"), default="natural",
                   help="remax.generation_length: fixed holds every response to --max_answer_seq_len tokens")
    p.add_argument("--greedy-eval", choices=("on", "off"), default="off",
                   help="after main.py, greedy accuracy of the initial and the saved actor on the eval split")
    return p.parse_known_args(argv)


def prepare(main_path: str) -> str:
    """Put main.py's folder and the checkout first on sys.path, as `python main.py` would; its absolute path.

    abspath, not realpath: DeepSpeed-Chat finds data/ three folders above utils/data, through the run directory's
    link to the checkout.
    """
    main_path = os.path.abspath(main_path)
    step3 = os.path.dirname(main_path)
    sys.path[:0] = [step3, os.path.dirname(step3)]
    return main_path


EVAL_LOG = "dschat_eval.json"  # beside the steps log: greedy accuracy on the eval split before and after training
DETERMINISTIC_ENV = "REMAX_BENCH_DETERMINISTIC_ALGORITHMS"  # reproducibility.determinism strict (the plan sets it)


def main(argv: list[str] | None = None) -> None:
    args, main_args = parse_args(sys.argv[1:] if argv is None else argv)
    if os.environ.get(DETERMINISTIC_ENV) == "1":
        import torch

        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    main_path = prepare(args.main)
    recorder = StepRecorder(args.steps_log)
    fixed_length = args.generation_length == "fixed"
    install(recorder, args.dataset, args.reward_url, fixed_length=fixed_length)
    sys.argv = [main_path] + main_args
    runpy.run_path(main_path, run_name="__main__")
    if args.greedy_eval == "on" and _rank() == 0:
        from reward_client import greedy_evaluation

        greedy_evaluation(main_args, args.dataset, args.reward_url, fixed_length,
                          Path(args.steps_log).with_name(EVAL_LOG))


if __name__ == "__main__":
    main()
