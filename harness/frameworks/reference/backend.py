"""The embedded reference ReMax backend's training loop: small, readable, runs anywhere (CUDA when present, else CPU).

It keeps a rollout model and a trainer model apart, as the real frameworks keep a generation engine and a
training engine apart, so moving updated weights into the rollout model is a real, timed transition.
One iteration: sample n responses per prompt and one greedy response per prompt (the baseline) with the
rollout model; score both with the shared reward; reference-policy log-probs for the KL penalty; one
REINFORCE update of the trainer (harness.remax); copy the new weights into the rollout model.
The three models are harness.frameworks.reference.model decoders loaded from the one policy checkpoint: each
prompt runs once for all its responses, greedy rows decode in the sampled batch. The shared reward (the rule, or a
reward model: harness.reward.shared) scores samples and greedy responses in one call; the task's exact-match
accuracy of the samples is logged beside it, so a reward model's score can be read against the truth.
"""

from __future__ import annotations

import json
import os
import random
import time
from pathlib import Path
from typing import TYPE_CHECKING

import torch

import harness
from harness import HarnessError, remax, reward
from harness.frameworks.reference import NAME, STEP_LOG
from harness.frameworks.reference.model import Decoder, generate, response_logprobs
from harness.frameworks.registry import run_id as framework_run_id
from harness.inputs import resolve_inputs, task
from harness.inputs.policy import load_policy, seed_everything
from harness.io import atomic_path, write_json
from harness.results import metrics
from harness.results.efficiency import cpu_matmul_peak, gpu_peak
from harness.results.layout import run_owner
from harness.results.summarize import EVAL_ROLE
from harness.reward.shared import SharedReward, load_shared_reward
from harness.runtime.manifest import MANIFEST_ROLE, build_manifest

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

_TICKS_PER_S = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _device(requested: str) -> torch.device:
    if requested == "cuda" and not torch.cuda.is_available():
        raise HarnessError("config: at reference.device: 'cuda' requested but no CUDA device is available")
    return torch.device("cuda" if requested != "cpu" and torch.cuda.is_available() else "cpu")


class _Clock:
    """Wall-clock timer that synchronizes the device first, so queued kernels are counted where they ran."""

    def __init__(self, device: torch.device):
        self.device = device
        # The probe's operands: fixed, and drawn from their own generator so the run's random stream is untouched.
        g = torch.Generator().manual_seed(0)
        self._probe_x = torch.randn(64, 64, generator=g)
        self._probe_w = (torch.randn(64, 256, generator=g) / 8, torch.randn(256, 64, generator=g) / 16)

    def now(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def cpu_now(self) -> float | None:
        """CPU time of this process; None on CUDA, where the host's CPU time says nothing about the work done."""
        return None if self.device.type == "cuda" else time.process_time()

    def machine_busy(self) -> float | None:
        """CPU-seconds every process on the machine has been busy since boot (Linux /proc/stat, steal included);
        minus this process's own CPU time, it is what other jobs took from the cores while a step ran."""
        if self.device.type == "cuda":
            return None
        try:
            with open("/proc/stat") as f:
                ticks = [int(v) for v in f.readline().split()[1:9]]
        except (OSError, ValueError):
            return None
        user, nice, system, _idle, _iowait, irq, softirq, steal = ticks
        return (user + nice + system + irq + softirq + steal) / _TICKS_PER_S

    def probe(self) -> float | None:
        """Seconds a fixed, small torch workload takes right now, on the run's own threads (CPU; None on CUDA).

        A shared or virtual CPU runs faster or slower from minute to minute (frequency, other tenants' cache and
        memory traffic), and that drift is most of the run-to-run noise of a throughput figure. Timed after every
        step, outside the step, the probe feels the same drift, and the regression check takes it out of the
        throughput (harness.regression.statistics.machine_sensitivity), while a slowdown in the run's own code leaves
        the probe as it was. Its shapes are those of a small transformer block, like the CPU profiles' policy; it does
        not use the policy, so a slower model or training loop cannot slow the probe with it."""
        if self.device.type == "cuda":
            return None
        x = self._probe_x
        t0 = time.perf_counter()
        for _ in range(8):
            h = torch.nn.functional.gelu(x @ self._probe_w[0])
            x = torch.softmax(torch.nn.functional.layer_norm(x + h @ self._probe_w[1], (64,)), -1)
        return time.perf_counter() - t0


def _peak(device: torch.device, model: Decoder) -> dict | None:
    """The peak FLOP/s this run's MFU is measured against: the GPU's data-sheet figure at the weights' dtype, or the
    CPU's fp32 matmul rate on the run's threads, measured now (outside the timed steps)."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        dtype = {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(model.embed.dtype, "fp32")
        flops = gpu_peak(name, dtype)
        return {"flops": flops, "source": f"{name} {dtype} data-sheet peak"} if flops else None
    return {"flops": cpu_matmul_peak(), "source": f"measured: fp32 512x512 matmuls on {torch.get_num_threads()} "
                                                  "torch thread(s)"}


def _generate(rollout: Decoder, tokenizer: PreTrainedTokenizerBase, prompts: list[str], *, n: int, greedy: bool,
              remax_cfg: dict, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Left-padded prompt ids and mask, and the responses: n sampled per prompt, then one greedy per prompt."""
    enc = tokenizer(prompts, padding=True, return_tensors="pt").to(device)
    response = generate(rollout, enc["input_ids"], enc["attention_mask"], n=n, greedy=greedy,
                        max_new_tokens=remax_cfg["max_response_length"], temperature=remax_cfg["temperature"],
                        top_p=remax_cfg["top_p"], eos_id=tokenizer.eos_token_id, pad_id=tokenizer.pad_token_id,
                        min_new_tokens=fixed_length_tokens(remax_cfg))
    return enc["input_ids"], enc["attention_mask"], response


def fixed_length_tokens(remax_cfg: dict) -> int:
    """Tokens before which EOS cannot be drawn: all of them for remax.generation_length fixed, none for natural."""
    return remax_cfg["max_response_length"] if remax_cfg["generation_length"] == "fixed" else 0


def _decode(tokenizer: PreTrainedTokenizerBase, response: torch.Tensor, mask: torch.Tensor) -> list[str]:
    # The mask is a prefix of each row (up to and including EOS), so a row's text is its first mask.sum() tokens.
    return tokenizer.batch_decode([r[:n] for r, n in zip(response.tolist(), mask.sum(-1).long().tolist())],
                                  skip_special_tokens=True)


def evaluate(model: Decoder, tokenizer: PreTrainedTokenizerBase, rows: list[dict], remax_cfg: dict, batch_size: int,
             device: torch.device, shared: SharedReward) -> dict:
    """Greedy accuracy (the task's truth), mean shared reward and each prompt's greedy response on `rows` (untimed; not
    part of any step). The responses before training are what step-0 agreement compares other frameworks with."""
    hits, total, kept = 0, 0.0, []
    for i in range(0, len(rows), batch_size):
        batch = rows[i:i + batch_size]
        prompts, answers = [r["prompt"] for r in batch], [r["answer"] for r in batch]
        _, _, response = _generate(model, tokenizer, prompts, n=0, greedy=True, remax_cfg=remax_cfg, device=device)
        texts = _decode(tokenizer, response, remax.response_mask(response, tokenizer.eos_token_id))
        hits += sum(reward.correct(t, a) for t, a in zip(texts, answers))
        total += sum(shared.score(prompts, texts, answers))
        kept += [{"prompt": p, "response": t} for p, t in zip(prompts, texts)]
    return {"greedy_accuracy": hits / len(rows), "reward_mean": total / len(rows), "n": len(rows), "responses": kept}


def _busy_wait(seconds: float) -> None:
    """Extra CPU work for `seconds`: a known, injected slowdown to prove that regression checks catch one."""
    end = time.perf_counter() + seconds
    x = torch.ones(64, 64)
    while time.perf_counter() < end:
        x = (x @ x).clamp_(max=1.0)


@torch.no_grad()
def _sync_weights(src: torch.nn.Module, dst: torch.nn.Module) -> None:
    for p_dst, p_src in zip(dst.parameters(), src.parameters()):
        p_dst.copy_(p_src)


# reproducibility.determinism strict: PyTorch's own switches (the reference backend is one process, no rollout engine).
STRICT = [
    {"knob": "CUBLAS_WORKSPACE_CONFIG=:4096:8", "source": "PyTorch 2.13 docs, Reproducibility (cuBLAS >= 10.2 needs a "
     "fixed workspace for deterministic matmuls)"},
    {"knob": "torch.use_deterministic_algorithms(True)", "source": "torch/__init__.py use_deterministic_algorithms "
     "(PyTorch 2.13): nondeterministic kernels raise instead of running"},
    {"knob": "torch.backends.cudnn.deterministic = True, benchmark = False",
     "source": "torch/backends/cudnn/__init__.py (PyTorch 2.13): no autotuned algorithm choice"},
]


def _determinism(mode: str) -> dict:
    """Apply reproducibility.determinism; the record the manifest keeps. Off still seeds python, numpy and torch."""
    if mode == "strict":
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    return {"mode": mode, "knobs": STRICT if mode == "strict" else []}


def train(config: dict, seed: int, out_dir: str | Path, inputs_dir: str | Path) -> None:
    """Train for config.remax.steps; write metrics.parquet, steps.jsonl, eval.json, manifest.json into out_dir.

    The directory appears only when the run has finished: an interrupted run leaves nothing that looks complete.
    """
    inputs = resolve_inputs(inputs_dir)
    dataset = task.read_dataset(inputs["dataset"]["path"])
    rc, xc = config["remax"], config["reference"]
    device = _device(xc["device"])
    if device.type == "cpu" and xc["threads"]:
        torch.set_num_threads(xc["threads"])
    run_id = framework_run_id(NAME, config, seed)
    framework_version = harness.__version__

    determinism = _determinism(config["reproducibility"]["determinism"])
    seed_everything(seed)
    shared = load_shared_reward(inputs["reward"], device=config["reward"]["device"],
                                batch_size=config["reward"]["batch_size"], max_length=config["reward"]["max_length"])
    policy, tokenizer = load_policy(inputs["policy"]["path"], device)
    trainer, rollout, ref = Decoder(policy), Decoder(policy), Decoder(policy)
    del policy
    for frozen in (rollout, ref):
        frozen.eval().requires_grad_(False)
    trainer.train()
    optimizer = make_optimizer(trainer, rc)
    clock = _Clock(device)
    peak = _peak(device, trainer)
    rng = random.Random(seed)
    eval_before = evaluate(rollout, tokenizer, dataset["eval"], rc, xc["eval_batch_size"], device, shared)
    started = time.time()

    with atomic_path(out_dir, owner=run_owner(NAME, seed)) as tmp:
        tmp.mkdir()
        rows = []
        with open(tmp / STEP_LOG, "w") as log:
            for step in range(1, rc["steps"] + 1):
                rows.append(_iteration(step, rng.sample(dataset["train"], rc["train_batch_size"]),
                                       trainer, rollout, ref, tokenizer, optimizer, rc, clock, device,
                                       xc["inject_slowdown"], shared))
                rows[-1].update(framework=NAME, framework_version=framework_version, run_id=run_id, seed=seed,
                                n_gpus=1 if device.type == "cuda" else 0)
                log.write(json.dumps(rows[-1], sort_keys=True) + "\n")
                log.flush()
        finished = time.time()
        eval_after = evaluate(rollout, tokenizer, dataset["eval"], rc, xc["eval_batch_size"], device, shared)
        metrics.write_metrics(metrics.to_frame(rows, str(tmp / STEP_LOG)), tmp / "metrics.parquet")
        write_json(tmp / "eval.json", {"run_id": run_id, "split": "eval", "before": eval_before, "after": eval_after},
                   role=EVAL_ROLE)
        write_json(tmp / "manifest.json", build_manifest(
            framework=NAME, framework_version=framework_version, run_id=run_id, seed=seed, config=config,
            inputs=inputs, extra={"device": str(device), "torch_threads": torch.get_num_threads(),
                                  "determinism": determinism,
                   "timed_window": {"start": started, "end": finished}, **({"peak_flops": peak} if peak else {})},
        ), role=MANIFEST_ROLE)


def make_optimizer(trainer: Decoder, rc: dict) -> torch.optim.Optimizer:
    """The trainer's optimizer: AdamW at remax.lr, PyTorch's defaults otherwise (betas 0.9/0.999, eps 1e-8, weight
    decay 0.01)."""
    return torch.optim.AdamW(trainer.parameters(), lr=rc["lr"])


def rollout(model: Decoder, tokenizer: PreTrainedTokenizerBase, batch: list[dict], rc: dict, device: torch.device,
            shared: SharedReward) -> dict:
    """One ReMax rollout of `batch` (rows of the task): n sampled responses per prompt and one greedy response per
    prompt (the baseline), each scored by the shared reward. The prompts are left-padded `ids`/`attn`, once per prompt;
    `response`/`mask` are the sampled rows (each prompt's n together), `baselines` the greedy reward per sampled row."""
    n = rc["rollout_n"]
    prompts = [r["prompt"] for r in batch]
    ids, attn, responses = _generate(model, tokenizer, prompts, n=n, greedy=True, remax_cfg=rc, device=device)
    sampled = len(prompts) * n
    masks = remax.response_mask(responses, tokenizer.eos_token_id)
    answers = [r["answer"] for r in batch]
    sample_answers = [a for a in answers for _ in range(n)]
    texts = _decode(tokenizer, responses, masks)
    samples = texts[:sampled]
    # Samples and greedy baselines in one call: one forward pass when the shared reward is a model.
    scored = shared.score([p for p in prompts for _ in range(n)] + prompts, texts, sample_answers + answers)
    baselines = torch.tensor(scored[sampled:])
    return {"ids": ids, "attn": attn, "n": n, "response": responses[:sampled], "mask": masks[:sampled],
            "greedy_mask": masks[sampled:], "scores": torch.tensor(scored[:sampled]).to(device),
            "baselines": baselines.repeat_interleave(n).to(device), "greedy_scores": baselines,
            "task_accuracy": sum(map(reward.correct, samples, sample_answers)) / len(samples)}


def update(trainer: Decoder, optimizer: torch.optim.Optimizer, batch: dict, ref_logprobs: torch.Tensor,
           rc: dict) -> dict:
    """The ReMax update on a rollout (`rollout`'s dict) whose reference-policy log-probs are `ref_logprobs`: the
    trainer's log-probs, the KL in the reward, REINFORCE's advantage against the greedy baseline, the token-mean loss,
    backward, the gradient clip and one optimizer step. Returns what it computed (the parity check compares it with
    each framework's own update on the same batch: harness/parity.py)."""
    mask = batch["mask"]
    logprobs = response_logprobs(trainer, batch["ids"], batch["attn"], batch["response"], batch["n"])
    kl = (logprobs.detach() - ref_logprobs) * mask
    rewards = remax.token_level_rewards(batch["scores"], kl, mask, rc["kl_coef"])
    advantages = remax.remax_advantages(rewards, batch["baselines"], mask)
    loss = remax.policy_gradient_loss(logprobs, advantages, mask)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(trainer.parameters(), rc["grad_clip"])
    optimizer.step()
    return {"logprobs": logprobs.detach(), "kl": kl, "advantages": advantages, "loss": loss.detach(),
            "grad_norm": grad_norm}


def _iteration(step: int, batch: list[dict], trainer: Decoder, rollout_model: Decoder, ref: Decoder,
               tokenizer: PreTrainedTokenizerBase, optimizer: torch.optim.Optimizer, rc: dict, clock: _Clock,
               device: torch.device, slowdown: float, shared: SharedReward) -> dict:
    n = rc["rollout_n"]
    t_start, cpu_start, busy_start = clock.now(), clock.cpu_now(), clock.machine_busy()

    rolled = rollout(rollout_model, tokenizer, batch, rc, device, shared)
    t_gen = clock.now()

    with torch.no_grad():
        ref_logprobs = response_logprobs(ref, rolled["ids"], rolled["attn"], rolled["response"], n)
    t_train = clock.now()
    updated = update(trainer, optimizer, rolled, ref_logprobs, rc)
    t_transition = clock.now()

    _sync_weights(trainer, rollout_model)
    t_synced = clock.now()
    if slowdown:  # lands in the step's "other" time, not in any phase
        _busy_wait(slowdown * (t_synced - t_start))
    t_end, cpu_end, busy_end = clock.now(), clock.cpu_now(), clock.machine_busy()
    probe = clock.probe()

    mask = rolled["mask"]
    response_tokens = mask.sum().item()
    return {
        "step": step,
        "time_step_s": t_end - t_start,
        "time_step_cpu_s": None if cpu_start is None or cpu_end is None else cpu_end - cpu_start,
        "time_machine_busy_s": None if busy_start is None or busy_end is None else busy_end - busy_start,
        "time_probe_s": probe,
        "time_gen_s": t_gen - t_start,
        "time_train_s": t_transition - t_train,
        "time_transition_s": t_synced - t_transition,
        "tokens_prompt": rolled["attn"].sum().item() * n,
        "tokens_response": response_tokens,
        "tokens_baseline": rolled["greedy_mask"].sum().item(),
        "reward_mean": rolled["scores"].mean().item(),
        "reward_baseline_mean": rolled["greedy_scores"].mean().item(),
        "task_accuracy_mean": rolled["task_accuracy"],
        "kl_mean": (updated["kl"].sum(-1)).mean().item(),
        "response_length_mean": response_tokens / len(mask),
        "loss": updated["loss"].item(),
    }
