"""Update parity: does each framework perform the same ReMax update as the reference, on one fixed batch?

Conformance (harness/conformance.py) checks a framework's advantage function on shared vectors; the throughput table
compares whole steps. Between them lies everything a framework does to turn an advantage into new weights: the
log-probs of the sampled tokens, where the KL term sits, how the loss is aggregated, the gradient clip and the
optimizer. Here the reference writes one batch (`write_batch`), each framework's own training code makes one update
from it in its own environment (the adapter's `parity` driver), and `compare` sets every quantity beside the
reference's, with the tolerance its precision allows and, where the difference has a known cause, the cause.

The batch (a folder, `write_batch`):
- actor/: the policy the update starts from (a Transformers checkpoint with its tokenizer): the shared initial policy
  after reference updates (`warm_steps` in settings.json) that take it KL_TARGET from the initial policy, so that
  the actor is not the KL anchor and the KL term weighs;
- ref/: the shared initial policy, the KL anchor (a copy: the folder is whole on its own);
- batch.pt (torch.save; torch.load(weights_only=True) reads it): `input_ids` and `attention_mask` (rows, P + T): each
  sampled row's prompt, left-padded to P = `prompt_length` tokens, then its response, right-padded after its EOS;
  `response_mask` (rows, T), 1 on response tokens up to and including EOS; `scores` (rows) the shared reward of each
  sampled response; `baselines` (rows) its prompt's greedy response's reward; `n` sampled responses per prompt (a
  prompt's rows together); `prompts`, `responses`, `answers`: the texts;
- settings.json: the config's `remax` block (lr, kl_coef, grad_clip, ...) and the seed.

What a driver writes (torch.save of a dict, the fields of `QUANTITIES` and):
- `logprobs`, `ref_logprobs`, `advantages`: (rows, T) float32, 0 outside the response mask: the actor's and the
  reference policy's log-probs of the sampled tokens before the update, and the advantage the loss weights them by;
- `loss`: the value backpropagated (the sum over micro-batches, as scaled for accumulation);
- `grad_norm`: the gradient's norm before clipping; `applied_grad_norm`: the norm of the gradient the optimizer
  step receives (after clipping);
- `weights`: every parameter after the optimizer step, float32, under the Transformers model's names; and
  `weights_before` (optional) where the framework's own start differs from the actor's weights (held in bf16: rounded);
- `precision`: the dtype the trainer's forward runs in ("fp32" or "bf16"); `calls`: the framework functions that made
  the update; `settings`: the optimizer and loss settings in effect, as the framework holds them.
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness import HarnessError
from harness.io import atomic_path, read_json_object, write_json

if TYPE_CHECKING:
    import torch

BATCH = "batch.pt"
SETTINGS = "settings.json"
# What SETTINGS and save_update's file are (harness.io.WRITTEN).
SETTINGS_ROLE, UPDATE_ROLE = "parity settings record", "parity update"
ACTOR = "actor"
REF = "ref"
OWNER = {"kind": "parity batch"}
# Reference updates before the batch, until a step's rollout finds the actor KL_TARGET (mean summed KL per response)
# from the initial policy, or MAX_WARM_STEPS of them: two on the cpu-frameworks profile (128 prompts a step), more
# where a step moves the policy less. With the actor at the initial policy the KL term would be exactly 0, and a
# framework that dropped it or flipped its sign would pass.
KL_TARGET = 0.5
MAX_WARM_STEPS = 50
# The batch's settings make every term of the update observable, whatever the run's: a KL coefficient of at least
# KL_PROBE (at the profiles' 0.001 a dropped KL term moves the advantages by ~2e-4, inside bf16's noise), and a
# gradient clip at CLIP_PROBE times the reference's gradient norm on the batch, so that every framework's clip acts
# and the threshold it holds shows in the gradient its optimizer receives (at a clip of 1.0 and a norm of 0.45 none
# acts, and a wrong threshold passes unseen).
KL_PROBE = 0.05
# Batches drawn until one holds responses of more than one length (fixed-length generation never does)
MAX_DRAWS = 20
CLIP_PROBE = 0.25
TENSORS = ("logprobs", "ref_logprobs", "advantages")
SCALARS = ("loss", "grad_norm", "applied_grad_norm")


def _reference_models(policy: Path) -> tuple[Any, Any, Any]:
    """The Transformers model, its tokenizer, and a reference Decoder of it."""
    from harness.frameworks.reference.model import Decoder
    from harness.inputs.policy import load_policy

    model, tokenizer = load_policy(policy)
    return model, tokenizer, Decoder(model)


def write_batch(config: dict, inputs_dir: str | Path, dest: str | Path) -> None:
    """The parity batch of this config's shared inputs (module docstring): reference updates from the initial policy
    until it is KL_TARGET away, then one rollout of `remax.train_batch_size` prompts from the updated policy, as a
    step samples."""
    import random

    import torch

    from harness.frameworks.reference.backend import make_optimizer, rollout, update
    from harness.frameworks.reference.model import response_logprobs, unpacked
    from harness.inputs import resolve_inputs, task
    from harness.inputs.policy import seed_everything
    from harness.reward.shared import load_shared_reward

    inputs = resolve_inputs(inputs_dir)
    rc, seed = config["remax"], config["seeds"][0]
    seed_everything(seed)
    rows = task.read_dataset(inputs["dataset"]["path"])["train"]
    shared = load_shared_reward(inputs["reward"], device="cpu", batch_size=config["reward"]["batch_size"],
                                max_length=config["reward"]["max_length"])
    model, tokenizer, trainer = _reference_models(Path(inputs["policy"]["path"]))
    _, _, ref = _reference_models(Path(inputs["policy"]["path"]))
    ref.requires_grad_(False)
    optimizer = make_optimizer(trainer, rc)
    rng = random.Random(seed)
    warm_steps, kl = 0, 0.0
    while kl < KL_TARGET and warm_steps < MAX_WARM_STEPS:
        rolled = rollout(trainer, tokenizer, rng.sample(rows, rc["train_batch_size"]), rc, torch.device("cpu"), shared)
        with torch.no_grad():
            ref_logprobs = response_logprobs(ref, rolled["ids"], rolled["attn"], rolled["response"], rolled["n"])
        kl = float(update(trainer, optimizer, rolled, ref_logprobs, rc)["kl"].sum(-1).mean())
        warm_steps += 1
    for _ in range(MAX_DRAWS):  # responses of one length cannot tell a token mean from a mean of sequence means
        chosen = rng.sample(rows, rc["train_batch_size"])
        with torch.no_grad():
            rolled = rollout(trainer, tokenizer, chosen, rc, torch.device("cpu"), shared)
        if len(set(rolled["mask"].sum(-1).tolist())) > 1:
            break
    n, mask = rolled["n"], rolled["mask"]
    prompt_ids, prompt_mask = rolled["ids"].repeat_interleave(n, 0), rolled["attn"].repeat_interleave(n, 0)
    response = torch.where(mask.bool(), rolled["response"], tokenizer.pad_token_id)
    texts = tokenizer.batch_decode([r[:int(k)] for r, k in zip(response.tolist(), mask.sum(-1).tolist())],
                                   skip_special_tokens=True)
    weights = unpacked(trainer, model)
    with torch.no_grad():  # named_parameters, not the state dict: a tied head is one parameter
        for name, param in model.named_parameters():
            param.copy_(weights[name])
    with atomic_path(dest, owner=OWNER) as tmp:
        tmp.mkdir()
        model.save_pretrained(tmp / ACTOR)
        tokenizer.save_pretrained(tmp / ACTOR)
        shutil.copytree(inputs["policy"]["path"], tmp / REF, symlinks=False)
        torch.save({"input_ids": torch.cat([prompt_ids, response], 1),
                    "attention_mask": torch.cat([prompt_mask, mask.long()], 1),
                    "response_mask": mask.float(), "prompt_length": prompt_ids.shape[1],
                    "scores": rolled["scores"].float(), "baselines": rolled["baselines"].float(), "n": n,
                    "prompts": [r["prompt"] for r in chosen for _ in range(n)], "responses": texts,
                    "answers": [r["answer"] for r in chosen for _ in range(n)]}, tmp / BATCH)
        probe = {**rc, "kl_coef": max(rc["kl_coef"], KL_PROBE)}
        write_json(tmp / SETTINGS, {"remax": probe, "seed": seed, "warm_steps": warm_steps}, role=SETTINGS_ROLE)
        norm = reference_update(tmp, remax={**probe, "grad_clip": math.inf})["grad_norm"]
        write_json(tmp / SETTINGS, {"remax": {**probe, "grad_clip": float(f"{CLIP_PROBE * norm:.3g}")},
                                    "seed": seed, "warm_steps": warm_steps,
                                    "run_settings": {k: rc[k] for k in ("kl_coef", "grad_clip")}}, role=SETTINGS_ROLE)


def read_batch(folder: str | Path) -> tuple[dict, dict]:
    """The batch's tensors and its settings; bad or missing files are named."""
    import torch

    folder = Path(folder)
    for part in (BATCH, SETTINGS, ACTOR, REF):
        if not (folder / part).exists():
            raise HarnessError(f"{folder}: not a parity batch (no {part}; `remax-bench parity` writes one)")
    try:
        batch = torch.load(folder / BATCH, weights_only=True)
    except Exception as e:  # torch raises many kinds for a damaged or foreign file
        raise HarnessError(f"{folder / BATCH}: not a parity batch ({type(e).__name__}: {e})") from None
    return batch, read_json_object(folder / SETTINGS, "a parity batch's settings")


def grad_norm_hook(optimizer: torch.optim.Optimizer, record: dict) -> None:
    """Record the norm of the gradient `optimizer` receives at its step (after any clipping) as
    record['applied_grad_norm']: the seam every driver observes the applied gradient at, for the one step a parity
    update makes. Summed over the calls of that step: ZeRO steps the basic optimizer once per parameter group, with
    only that group in param_groups."""
    def hook(opt: torch.optim.Optimizer, *_: Any) -> None:
        for group in opt.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    grad = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad  # FSDP2's DTensor
                    # float64: a float32 norm of a ZeRO partition (one flat tensor of every weight) is ~1e-4 off
                    record["applied_sq"] = record.get("applied_sq", 0.0) + float(grad.double().norm()) ** 2
        record["applied_grad_norm"] = record.get("applied_sq", 0.0) ** 0.5
    optimizer.register_step_pre_hook(hook)


def reference_update(folder: str | Path, remax: dict | None = None) -> dict:
    """The reference backend's update on the batch (reference/backend.update), in the drivers' output form; under
    the batch's settings, or `remax` where given."""
    import torch

    from harness.frameworks.reference.backend import make_optimizer, update
    from harness.frameworks.reference.model import response_logprobs, unpacked

    folder = Path(folder)
    batch, settings = read_batch(folder)
    rc = remax or settings["remax"]
    model, _, trainer = _reference_models(folder / ACTOR)
    _, _, ref = _reference_models(folder / REF)
    n, width = batch["n"], batch["prompt_length"]
    ids, attn = batch["input_ids"][::n, :width], batch["attention_mask"][::n, :width]
    rolled = {"ids": ids, "attn": attn, "n": n, "response": batch["input_ids"][:, width:],
              "mask": batch["response_mask"], "scores": batch["scores"], "baselines": batch["baselines"]}
    with torch.no_grad():
        ref_logprobs = response_logprobs(ref, ids, attn, rolled["response"], n)
    optimizer = make_optimizer(trainer, rc)
    record: dict = {}
    grad_norm_hook(optimizer, record)

    out = update(trainer, optimizer, rolled, ref_logprobs, rc)
    mask = batch["response_mask"]
    return {"logprobs": out["logprobs"] * mask, "ref_logprobs": ref_logprobs * mask, "advantages": out["advantages"],
            "loss": float(out["loss"]), "grad_norm": float(out["grad_norm"]), **record,
            "weights": unpacked(trainer, model), "precision": "fp32",
            "calls": ["harness.frameworks.reference.backend.update"],
            "settings": {"optimizer": "torch.optim.AdamW", "lr": rc["lr"], "betas": [0.9, 0.999], "eps": 1e-8,
                         "weight_decay": 0.01, "loss": "token mean over the batch", "grad_clip": rc["grad_clip"],
                         "kl": f"in the reward, k1, coefficient {rc['kl_coef']}"}}


def driver_python(env: str, config: dict, ensure: Callable[[str], Path] | None = None) -> list[str]:
    """The Python a parity driver runs under, as the framework's runs do (container.env_command): the venv's, built
    first where missing (`ensure`: envs.ensure_env, or an adapter's own that also patches it), or the image's inside
    `apptainer exec` under container.runtime apptainer."""
    from harness.runtime import container, envs

    if config["container"]["runtime"] == "apptainer":
        return container.env_command(env, config, "python")
    return [str((ensure or envs.ensure_env)(env))]


def run_driver(python: list[str], driver: Path, batch: Path, out: Path, args: list[str], framework: str,
               gpu: bool = False) -> None:
    """Run a framework's parity driver (`PYTHON driver --batch B --out O ARGS...`, PYTHON from driver_python) in its
    environment: the update it writes to `out`, checked; its stderr's tail in the error where it fails. `gpu`: the
    config's runs are on GPUs, which the driver then sees (on a CPU config none, so that no framework picks a GPU the
    runs did not have)."""
    from harness.runtime.envs import REPO

    proc = subprocess.run([*python, str(driver), "--batch", str(batch), "--out", str(out), *args],
                          capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO), **({} if gpu else {"CUDA_VISIBLE_DEVICES": ""})})
    if proc.returncode:
        raise HarnessError(f"{framework}: its parity driver ({driver.relative_to(REPO)}) failed in "
                           f"{' '.join(python)}:\n{(proc.stderr or proc.stdout)[-3000:]}")
    read_update(out)


def read_update(path: str | Path) -> dict:
    """A driver's output, checked for the fields `compare` reads."""
    import torch

    path = Path(path)
    try:
        out = torch.load(path, weights_only=True)
    except Exception as e:
        raise HarnessError(f"{path}: not a parity update ({type(e).__name__}: {e})") from None
    missing = [k for k in (*TENSORS, *SCALARS, "weights", "precision") if k not in out]
    if missing:
        raise HarnessError(f"{path}: a parity update without {', '.join(missing)}")
    return out


def save_update(out: dict, path: str | Path) -> None:
    import torch

    with atomic_path(path, role=UPDATE_ROLE) as tmp:
        torch.save(out, tmp)
