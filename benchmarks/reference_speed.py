"""Benchmark: the reference backend's ReMax step against a plain PyTorch/Transformers ReMax loop, side by side.

    python benchmarks/reference_speed.py [--config FILE] [--steps 60] [--rounds 6] [--warmup 10]

Both loops do the same work on the same shared inputs (built from --config, the default profile's, into a
temporary directory): the same policy checkpoint, the same batches of prompts, n sampled responses and one greedy
response per prompt, the shared reward, a reference-policy forward for the KL penalty, one REINFORCE update, the
copy of the new weights into the rollout model. The plain loop is what a ReMax loop on Transformers looks like
(`generate` for the sampled and for the greedy responses, full forwards of the reference and the trainer); the
reference backend runs its own step (harness.frameworks.reference.backend._iteration). Each trains its own copy, in
alternating rounds of --steps steps (so machine drift hits both alike), after --warmup untimed steps each.
Tokens/s is the harness's definition (prompt + response tokens of the sampled rows, per step second). Prints the
median tokens/s of each, the ratio per round and overall; exits 1 when the ratio is below 1.5 (issue #18's target).
Nothing else should run on the machine meanwhile.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from harness import remax  # noqa: E402
from harness.config import load_config  # noqa: E402
from harness.frameworks.reference import backend as reference_backend  # noqa: E402
from harness.frameworks.reference.model import Decoder  # noqa: E402
from harness.inputs import (  # noqa: E402
    build_dataset,
    build_policy,
    build_reward,
    resolve_inputs,
    task,
)
from harness.inputs.policy import load_policy, seed_everything, token_logprobs  # noqa: E402
from harness.reward.shared import load_shared_reward  # noqa: E402

TARGET = 1.5


def plain_generate(model, tokenizer, prompts, *, n, greedy, rc):
    enc = tokenizer(prompts, padding=True, return_tensors="pt")
    ids, attn = enc["input_ids"].repeat_interleave(n, 0), enc["attention_mask"].repeat_interleave(n, 0)
    sampling = {"do_sample": False} if greedy else {
        "do_sample": True, "temperature": rc["temperature"], "top_p": rc["top_p"], "top_k": 0}
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=attn, max_new_tokens=rc["max_response_length"],
                             pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, **sampling)
    response = out[:, ids.shape[1]:]
    return ids, attn, response, remax.response_mask(response, tokenizer.eos_token_id)


def plain_step(batch, trainer, rollout, ref, tokenizer, optimizer, rc, shared) -> dict:
    """One ReMax iteration the plain way; returns its tokens and seconds."""
    n, t0 = rc["rollout_n"], time.perf_counter()
    prompts, answers = [r["prompt"] for r in batch], [r["answer"] for r in batch]
    ids, attn, response, mask = plain_generate(rollout, tokenizer, prompts, n=n, greedy=False, rc=rc)
    _, _, greedy, greedy_mask = plain_generate(rollout, tokenizer, prompts, n=1, greedy=True, rc=rc)
    decode = [tokenizer.decode(r[m.bool()], skip_special_tokens=True)
              for r, m in [*zip(response, mask), *zip(greedy, greedy_mask)]]
    scored = shared.score([p for p in prompts for _ in range(n)] + prompts, decode,
                          [a for a in answers for _ in range(n)] + answers)
    scores, baselines = torch.tensor(scored[:len(response)]), torch.tensor(scored[len(response):])
    full_ids, full_attn = torch.cat([ids, response], 1), torch.cat([attn, mask.long()], 1)
    start = ids.shape[1] - 1
    with torch.no_grad():
        ref_logprobs = token_logprobs(ref, full_ids, full_attn)[:, start:]
    logprobs = token_logprobs(trainer, full_ids, full_attn)[:, start:]
    kl = (logprobs.detach() - ref_logprobs) * mask
    rewards = remax.token_level_rewards(scores, kl, mask, rc["kl_coef"])
    loss = remax.policy_gradient_loss(logprobs, remax.remax_advantages(rewards, baselines.repeat_interleave(n),
                                                                       mask), mask)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(trainer.parameters(), rc["grad_clip"])
    optimizer.step()
    with torch.no_grad():
        for p_dst, p_src in zip(rollout.parameters(), trainer.parameters()):
            p_dst.copy_(p_src)
    return {"tokens": attn.sum().item() + mask.sum().item(), "seconds": time.perf_counter() - t0,
            "reward": scores.mean().item()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", type=Path, default=REPO / "workflows" / "config" / "cpu.yaml")
    ap.add_argument("--steps", type=int, default=60, help="steps per round")
    ap.add_argument("--rounds", type=int, default=6, help="rounds per loop, alternating")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    config = load_config(args.config)
    rc = config["remax"]
    if config["reference"]["threads"]:
        torch.set_num_threads(config["reference"]["threads"])
    inputs_dir = Path(tempfile.mkdtemp(prefix="reference-speed-"))
    for build in (build_dataset, build_policy, build_reward):
        build(config, inputs_dir)
    inputs = resolve_inputs(inputs_dir)
    train = task.read_dataset(inputs["dataset"]["path"])["train"]
    shared = load_shared_reward(inputs["reward"])
    device = torch.device("cpu")
    clock = reference_backend._Clock(device)

    def models(pack):
        loaded = [load_policy(inputs["policy"]["path"])[0] for _ in range(3)]
        trainer, rollout, ref = (Decoder(m) for m in loaded) if pack else loaded
        for frozen in (rollout, ref):
            frozen.eval().requires_grad_(False)
        return trainer, rollout, ref, torch.optim.AdamW(trainer.parameters(), lr=rc["lr"])

    tokenizer = load_policy(inputs["policy"]["path"])[1]
    seed_everything(args.seed)
    loops = {"plain": models(pack=False), "reference": models(pack=True)}
    batches = {name: random.Random(args.seed) for name in loops}

    def step(name):
        trainer, rollout, ref, optimizer = loops[name]
        batch = batches[name].sample(train, rc["train_batch_size"])
        if name == "plain":
            return plain_step(batch, trainer, rollout, ref, tokenizer, optimizer, rc, shared)
        row = reference_backend._iteration(0, batch, trainer, rollout, ref, tokenizer, optimizer, rc, clock, device,
                                           0.0, shared)
        return {"tokens": row["tokens_prompt"] + row["tokens_response"], "seconds": row["time_step_s"],
                "reward": row["reward_mean"]}

    for name in loops:
        for _ in range(args.warmup):
            step(name)
    rates = {name: [] for name in loops}
    rewards = {name: [] for name in loops}
    ratios = []
    for _ in range(args.rounds):
        for name in loops:
            steps = [step(name) for _ in range(args.steps)]
            rates[name].append(sum(s["tokens"] for s in steps) / sum(s["seconds"] for s in steps))
            rewards[name] += [s["reward"] for s in steps]
        ratios.append(rates["reference"][-1] / rates["plain"][-1])
    ratio = statistics.median(ratios)
    print(json.dumps({
        "config": str(args.config), "steps_per_round": args.steps, "rounds": args.rounds,
        "torch_threads": torch.get_num_threads(),
        "tokens_per_s": {name: round(statistics.median(r), 1) for name, r in rates.items()},
        "ratio_per_round": [round(r, 3) for r in ratios],
        "ratio_median": round(ratio, 3),
        "reward_mean_last_round": {name: round(statistics.mean(r[-args.steps:]), 3) for name, r in rewards.items()},
        "target": TARGET,
    }, indent=2))
    return 0 if ratio >= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
