"""The parity check's judgement: one framework's update on the batch against the reference's, quantity by quantity
(harness.parity's protocol), with the tolerance its precision allows and the cause of a difference where one is
known."""

from __future__ import annotations

from typing import TYPE_CHECKING

from harness import HarnessError

if TYPE_CHECKING:
    import torch

# What a quantity may differ by and still be the same update, by the precision the framework's trainer forward runs
# in (the reference runs in fp32). Against the reference: log-probs by their mean absolute difference over the
# response tokens (nats; fp32: another kernel's summation order; bf16: 8 bits of mantissa, and a log-softmax taken
# in bf16 where a framework's CPU path has no fp32 kernel), the gradient's norm relatively, the update (the weights
# after the step minus before) by the larger of 1 - its cosine with the reference's and its length ratio's distance
# from 1 (Adam's first step is lr times the gradient's sign where |g| >> eps, so a small gradient element whose sign
# the noise flips turns the update a little). Measured on two cpu-frameworks batches with verl's bf16 forward:
# log-probs 0.0046-0.0056 mean, gradient norm 0.1-7.9%, update 1 - cosine 0.007-0.014, length 0.9987-0.9999 (fp32
# with the same code: 6e-7, 3e-7, 5e-5 relative difference). A bf16 log-prob's error grows with |log p|: the tolerance
# is 0.01 + 2**-7 x the batch's mean |log p| (DeepSpeed-Chat on a fixed-length batch of junk tokens: 0.025 at a mean
# |log p| of ~2).
TOLERANCE = {
    "fp32": {"logprobs": 1e-5, "logprobs_rel": 0.0, "grad_norm": 1e-3, "update": 0.005, "own": 1e-5},
    "bf16": {"logprobs": 0.01, "logprobs_rel": 2 ** -7, "grad_norm": 0.15, "update": 0.05, "own": 0.01},
}
# The advantages, the loss and the applied gradient are judged from the framework's own inputs (its log-probs, its
# advantages, its gradient norm before the clip), so a precision difference upstream is not taken for a different
# rule: "own" is the arithmetic's own rounding (fp32; or bf16 where the framework does the arithmetic in it).
# Adam's update at its second step after a zero gradient, over its first: bias-corrected (1 - b1) / (1 - b1**2) over
# sqrt((1 - b2) / (1 - b2**2)) at PyTorch's betas (0.9, 0.999)
ADAM_SECOND_STEP = (0.1 / 0.19) / (0.001 / 0.001999) ** 0.5
QUANTITIES = ("logprobs", "ref_logprobs", "advantages", "loss", "grad_norm", "applied_grad_norm", "update")
REFERENCE, OWN = "the reference's", "its own inputs"


def _advantage_rules(batch: dict, theirs: dict, rc: dict) -> dict[str, torch.Tensor]:
    """ReMax's advantage (first) and the variants a framework might compute, from the framework's own log-probs: each
    but the first names a cause of an advantage difference."""
    from harness.remax import remax_advantages, token_level_rewards

    mask = batch["response_mask"]
    kl = (theirs["logprobs"].float() - theirs["ref_logprobs"].float()) * mask

    def adv(coef: float) -> torch.Tensor:
        return remax_advantages(token_level_rewards(batch["scores"], kl, mask, coef), batch["baselines"], mask)
    own_token = remax_advantages(token_level_rewards(batch["scores"], kl * 0, mask, 0.0), batch["baselines"], mask) \
        - rc["kl_coef"] * kl
    return {"ReMax": adv(rc["kl_coef"]),
            "the KL penalty only at its own token, not summed over the tokens after it (no reward-to-go of the KL)":
                own_token,
            "the KL term is left out of the reward": adv(0.0),
            "the KL term's sign is flipped (the reward adds the KL)": adv(-rc["kl_coef"]),
            f"the KL coefficient is {rc['kl_coef'] * 10:g}, not {rc['kl_coef']:g}": adv(rc["kl_coef"] * 10),
            f"the KL coefficient is {rc['kl_coef'] / 10:g}, not {rc['kl_coef']:g}": adv(rc["kl_coef"] / 10)}


def _loss_forms(batch: dict, theirs: dict) -> dict[str, float]:
    """The loss value under each aggregation in use in the field (verl's loss_agg_mode names), from the framework's
    own advantages and log-probs, as REINFORCE's -A log pi or as PPO's surrogate -A ratio at ratio 1 (the first update
    on a batch). The first is the reference's rule."""
    mask = batch["response_mask"]
    lengths = mask.sum(-1).clamp(min=1)
    forms = {}
    for surrogate, per_token in (("", -theirs["advantages"].float() * theirs["logprobs"].float() * mask),
                                 (" (PPO's surrogate -A x ratio, at ratio 1)", -theirs["advantages"].float() * mask)):
        forms["token mean" + surrogate] = float(per_token.sum() / mask.sum())
        forms["sequence mean of token means" + surrogate] = float((per_token.sum(-1) / lengths).mean())
        forms["sequence mean of token sums" + surrogate] = float(per_token.sum(-1).mean())
        forms["token sum" + surrogate] = float(per_token.sum())
        forms[f"token sum / (rows x {mask.shape[1]}) (Dr. GRPO's constant)" + surrogate] = float(
            per_token.sum() / mask.numel())
    return forms


def _rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-12)


def compare(framework: str, theirs: dict, ref: dict, batch: dict, settings: dict, start: dict) -> list[dict]:
    """One row per quantity of QUANTITIES: the framework's update on the batch, each quantity against the reference's
    or against what the ReMax rule gives from the framework's own inputs (`compared_with`); `start`: the weights
    before the step. Verdicts: match (within tolerance), explained (beyond it, for a named cause that leaves the update
    as it is), differs (beyond it; the cause where one is known)."""
    rc = settings["remax"]
    mask = batch["response_mask"].bool()
    precision = str(theirs["precision"])
    tol = TOLERANCE.get(precision, TOLERANCE["bf16"])
    rows = [*(_logprob_row(quantity, theirs, ref, mask, tol) for quantity in ("logprobs", "ref_logprobs")),
            _advantage_row(batch, theirs, ref, rc, mask, tol), _loss_row(batch, theirs, ref, tol),
            _row("grad_norm", _rel(float(theirs["grad_norm"]), float(ref["grad_norm"])), float(theirs["grad_norm"]),
                 float(ref["grad_norm"]), tol["grad_norm"], REFERENCE, note="the gradient's norm before the clip"),
            _applied_row(theirs, rc), _update_row(framework, theirs, ref, start, tol)]
    return [{"framework": framework, "precision": precision, **r} for r in rows]


def _row(quantity: str, diff: float, value: float | None, expected: float | None, limit: float, against: str,
         relative: bool = True, verdict: str | None = None, note: str = "") -> dict:
    return {"quantity": quantity, "value": value, "expected": expected, "compared_with": against, "difference": diff,
            "relative": relative, "tolerance": limit, "verdict": verdict or ("match" if diff <= limit else "differs"),
            "note": note}


def _logprob_row(quantity: str, theirs: dict, ref: dict, mask: torch.Tensor, tol: dict) -> dict:
    """Log-probs by their mean absolute difference; in bf16 the tolerance grows with the mean |log p|: a token of log
    p -10 comes out of a bf16 log-softmax 2**-8 x 10 apart (the fixed-length batch's sampled junk tokens)."""
    gap = (theirs[quantity].float() - ref[quantity]).abs()[mask]
    size = float(ref[quantity].abs()[mask].mean())
    return _row(quantity, float(gap.mean()), None, None, tol["logprobs"] + tol["logprobs_rel"] * size, REFERENCE,
                relative=False, note=f"mean absolute difference over the response tokens (mean |log p| {size:.3g}); "
                                     f"largest {float(gap.max()):.3g}")


def _advantage_row(batch: dict, theirs: dict, ref: dict, rc: dict, mask: torch.Tensor, tol: dict) -> dict:
    mine = theirs["advantages"].float()
    gaps = {rule: float((mine - adv).abs()[mask].max()) for rule, adv in _advantage_rules(batch, theirs, rc).items()}
    found = [rule for rule, gap in gaps.items() if gap <= tol["own"]]
    versus = float((mine - ref["advantages"]).abs()[mask].max())
    return _row("advantages", gaps["ReMax"], None, None, tol["own"], OWN, relative=False,
                note=(f"{found[0]}; " if found and found[0] != "ReMax" else
                      "" if found else "no known ReMax variant gives these advantages; ") +
                f"largest difference from the reference's own advantages {versus:.3g}")


def _loss_row(batch: dict, theirs: dict, ref: dict, tol: dict) -> dict:
    forms = _loss_forms(batch, theirs)
    expected = next(iter(forms.values()))
    loss = float(theirs["loss"])
    named = [form for form, value in forms.items() if _rel(loss, value) <= tol["own"]]
    surrogate = bool(named) and named[0].startswith("token mean (")
    note = f"the reference's loss {float(ref['loss']):.4g}"
    if named and named[0] != "token mean":
        note = f"{named[0]} against the reference's token mean of -A log pi" + (
            ": another value, the same gradient (d ratio = d log pi at ratio 1)" if surrogate else "") + "; " + note
    elif not named:
        note = "no known aggregation gives this value; " + note
    return _row("loss", _rel(loss, expected), loss, expected, tol["own"], OWN,
                verdict="explained" if surrogate else None, note=note)


def _applied_row(theirs: dict, rc: dict) -> dict:
    """The norm the optimizer step received against the batch's clip of the framework's own norm before it."""
    applied, before = float(theirs["applied_grad_norm"]), float(theirs["grad_norm"])
    clipped = min(before, rc["grad_clip"])
    diff = _rel(applied, clipped)
    held = theirs.get("settings", {}).get("grad_clip")
    clip = f"the batch's clip is {rc['grad_clip']:g}" + (f" (the framework holds {held})" if held is not None else "")
    return _row("applied_grad_norm", diff, applied, clipped, 1e-3, OWN,
                note=f"the clip at {rc['grad_clip']:g} of its own norm {before:.4g}" if diff <= 1e-3 else
                f"not clipped (the applied norm is the norm before the clip), where {clip}"
                if _rel(applied, before) <= 1e-3 else f"clipped to {applied:.4g}, where {clip}")


def _update_row(framework: str, theirs: dict, ref: dict, start: dict, tol: dict) -> dict:
    import torch

    ours, theirs_update, padded = [], [], []
    # A framework that holds the weights in bf16 starts from them rounded: its update is measured from its own start
    origin = theirs.get("weights_before") or start
    for name, weight in start.items():
        if name not in theirs["weights"] or name not in origin:
            raise HarnessError(f"{framework}: its parity update has no weight {name!r} (it has "
                               f"{', '.join(sorted(theirs['weights'])[:5])} ...)")
        after, before = theirs["weights"][name].float(), origin[name].float()
        if after.shape != weight.shape:  # a vocabulary padded to a multiple of 8 (DeepSpeed-Chat): its first rows
            if after.dim() != weight.dim() or any(a < w for a, w in zip(after.shape, weight.shape)):
                raise HarnessError(f"{framework}: its weight {name!r} has shape {tuple(after.shape)}, the "
                                   f"policy's {tuple(weight.shape)}")
            padded.append(f"{name} {tuple(after.shape)} against {tuple(weight.shape)}")
            rows = tuple(slice(0, n) for n in weight.shape)
            after, before = after[rows], before[rows] if before.shape != weight.shape else before
        ours.append((ref["weights"][name] - weight).flatten())
        theirs_update.append((after - before).flatten())
    d_ref, d_fw = torch.cat(ours), torch.cat(theirs_update)
    cosine = float(torch.nn.functional.cosine_similarity(d_fw, d_ref, dim=0))
    ratio = float(d_fw.norm() / d_ref.norm().clamp(min=1e-12))
    second_step = (f"; a norm ratio of {ADAM_SECOND_STEP:.3f} is Adam's second step on a fresh gradient: the "
                   "optimizer stepped once before (DeepSpeed's FP16_Optimizer, bf16 without ZeRO, steps at "
                   "construction with zero gradients)") if abs(ratio / ADAM_SECOND_STEP - 1) <= 0.05 else ""
    # Direction and length apart: a bf16 gradient flips the sign of a few small elements (Adam's first step is their
    # sign), which turns the update a little; a scale (a second Adam step, another lr) leaves its direction as it is
    return _row("update", max(1 - cosine, abs(ratio - 1)), float(d_fw.norm()), float(d_ref.norm()), tol["update"],
                REFERENCE, note=f"weights after the step minus before: 1 - cosine {1 - cosine:.3g}, norm ratio "
                                f"{ratio:.4f} (relative difference "
                                f"{float((d_fw - d_ref).norm() / d_ref.norm().clamp(min=1e-12)):.3g})" +
                second_step + _setting_differences(theirs, ref) +
                (f"; padded weights, compared on the policy's rows: {', '.join(padded)}" if padded else ""))


OPTIMIZER_SETTINGS = ("lr", "betas", "eps", "weight_decay")


def _setting_differences(theirs: dict, ref: dict) -> str:
    mine, other = ref.get("settings", {}), theirs.get("settings", {})
    differ = [f"{k} {other[k]} against {mine[k]}" for k in OPTIMIZER_SETTINGS
              if k in other and k in mine and str(other[k]) != str(mine[k])]
    return f"; optimizer settings that differ: {', '.join(differ)}" if differ else ""


def summary(rows: list[dict]) -> str:
    """One line per framework: the quantities that match, those explained, then the first that differs, with its
    cause."""
    first = next((r for r in rows if r["verdict"] in ("differs", "failed")), None)
    if first is not None and first["verdict"] == "failed":
        return f"its driver failed: {first['note']}"
    before = rows[:rows.index(first)] if first else rows
    same = [r["quantity"] for r in before if r["verdict"] == "match"]
    explained = [f"{r['quantity']} ({str(r['note']).split(';')[0]})" for r in before if r["verdict"] == "explained"]
    head = (f"{', '.join(same)} equal" if same else "nothing equal") + (
        f"; explained: {', '.join(explained)}" if explained else "")
    if first is None:
        return f"the same update: {head}"
    note = first["note"] if isinstance(first["note"], str) else ""  # read back from the CSV, an empty note is NaN
    return f"{head}; {first['quantity']} differs" + (f": {note}" if note else "")
