"""One OpenRLHF 0.11.2 ReMax update on the harness's parity batch (harness/parity.py), in OpenRLHF's own environment.

    python parity_driver.py --batch DIR --out FILE [--env=K=V ...] [--max-steps=N] -- TRAIN_PPO_RAY_FLAGS...

The flags are a run's own (harness/frameworks/openrlhf/parity.py builds them with the plan's functions) and are parsed
by train_ppo_ray's own parser; --env sets the environment variables a run's launch.sh sets (on a CPU config the CPU
layer's REMAX_BENCH_OPENRLHF_CPU and DS_ACCELERATOR), and the driver starts again under them, as every process of a
run starts under them. The update is made by OpenRLHF's own objects, in the order a step calls them:
PolicyModelActor.init_model_from_pretrained (Actor, the DeepSpeed engine of strategy.prepare, ActorPPOTrainer),
ReferenceModelActor.init_model_from_pretrained, SamplesGenerator._process_response_into_experience,
RemoteExperienceMaker.make_experience_batch (the actor's and the reference's forward, the k1 KL,
compute_advantages_and_returns with the harness's remax estimator and compute_reward), PolicyModelActor.append and
.fit (ActorPPOTrainer.ppo_train: PolicyLoss, strategy.backward, strategy.optimizer_step = the DeepSpeed engine's step
with its gradient clipping).

What is replaced, and why:
- Ray: the actors' classes are used without Ray (the class ray.remote wraps), in this one process, on one rank; the
  experience maker's `ray.put`/`ray.get` and its model groups' async calls become direct calls. Ray only moves the
  same objects between processes.
- Generation and reward: the ReMax agent's response per sample (prompt tokens, sampled tokens, reward, and the greedy
  baseline in extra_logs) is built from the batch: the prompt without its left padding (the agent's prompt tokens,
  BOS included), the response up to and including EOS, scores and baselines as the shared reward gave them.
- The reference policy: a run starts its reference from the actor's checkpoint (--actor.model_name_or_path); here the
  actor is the batch's (after warm-up steps) and the reference the batch's ref/ folder, so that the KL is not zero.
- Observation only: strategy.backward records the loss it is given; a step pre-hook on the torch optimizer inside
  DeepSpeed's wrapper records the norm of the gradient that optimizer receives; the gradient norm before clipping is
  what OpenRLHF itself logs (strategy.get_grad_norm: the engine's get_global_grad_norm).

`weights` is the optimizer's float32 copy of every parameter (DeepSpeed keeps one under bf16), measured from its own
start (`weights_before`: the weights rounded to bf16 as loaded); `weights_bf16` the copy the model runs in, rounded
from it.
"""

from __future__ import annotations

import copy
import os
import runpy
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from harness.parity import grad_norm_hook

CALLS = [
    "openrlhf.cli.train_ppo_ray (its __main__ argument parser and checks)",
    "openrlhf.utils.get_strategy",
    "openrlhf.trainer.ray.ppo_actor.PolicyModelActor.init_model_from_pretrained",
    "openrlhf.trainer.ray.launcher.ReferenceModelActor.init_model_from_pretrained",
    "openrlhf.trainer.ppo_utils.samples_generator.SamplesGenerator._process_response_into_experience",
    "openrlhf.trainer.ppo_utils.experience_maker.RemoteExperienceMaker.make_experience_batch",
    "openrlhf.trainer.ray.ppo_actor.PolicyModelActor.forward",
    "openrlhf.trainer.ray.launcher.ReferenceModelActor.forward",
    "openrlhf.models.utils.compute_approx_kl",
    "openrlhf.trainer.ppo_utils.experience_maker.RemoteExperienceMaker.compute_advantages_and_returns",
    "openrlhf.models.utils.compute_reward",
    "openrlhf.trainer.ray.ppo_actor.PolicyModelActor.append",
    "openrlhf.trainer.ray.ppo_actor.PolicyModelActor.fit",
    "openrlhf.trainer.ray.ppo_actor.ActorPPOTrainer.training_step",
    "openrlhf.models.loss.PolicyLoss",
    "openrlhf.utils.deepspeed.DeepspeedStrategy.backward",
    "openrlhf.utils.deepspeed.DeepspeedStrategy.optimizer_step",
    "openrlhf.utils.deepspeed.DeepspeedStrategy.get_grad_norm",
]


def own_options(argv: list[str]) -> tuple[dict, list[str]]:
    """The driver's options (before `--`) and train_ppo_ray's flags (after it)."""
    split = argv.index("--") if "--" in argv else len(argv)
    opts: dict[str, Any] = {"env": {}, "max_steps": 1}
    mine = iter(argv[:split])
    for word in mine:
        key, _, value = word.partition("=")
        if not value and key in ("--batch", "--out", "--max-steps"):
            value = next(mine)
        if key == "--env":
            name, _, val = value.partition("=")
            opts["env"][name] = val
        elif key == "--max-steps":
            opts["max_steps"] = int(value)
        elif key in ("--batch", "--out"):
            opts[key[2:]] = Path(value)
        else:
            raise SystemExit(f"parity_driver: unknown option {word!r}")
    if "batch" not in opts or "out" not in opts:
        raise SystemExit("parity_driver: --batch and --out are required")
    return opts, argv[split + 1:]


def start_under(env: dict[str, str]) -> None:
    """Start again with the run's environment variables where this process lacks them: the CPU layer (sitecustomize)
    and DeepSpeed's accelerator read them when the interpreter starts."""
    if all(os.environ.get(k) == v for k, v in env.items()):
        return
    os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **env})


def parse_flags(flags: list[str]) -> Any:
    """train_ppo_ray's args for `flags`, from its own parser and checks: its __main__ runs until `train` asks for the
    strategy, with Ray taken as started (train would start a cluster first)."""
    import openrlhf.utils  # type: ignore[import-not-found]
    import ray  # type: ignore[import-not-found]

    class Parsed(Exception):
        pass

    def capture(args: Any) -> None:
        raise Parsed(args)

    saved = openrlhf.utils.get_strategy, ray.is_initialized, sys.argv
    openrlhf.utils.get_strategy, ray.is_initialized = capture, lambda: True
    sys.argv = ["train_ppo_ray", *flags]
    try:
        runpy.run_module("openrlhf.cli.train_ppo_ray", run_name="__main__")
    except Parsed as parsed:
        return parsed.args[0]
    finally:
        openrlhf.utils.get_strategy, ray.is_initialized, sys.argv = saved
    raise RuntimeError("train_ppo_ray's __main__ never asked for a strategy")


def without_ray(actor_class: Any) -> type:
    """The class a ray.remote actor class wraps."""
    return actor_class.__ray_metadata__.modified_class


class LocalGroup:
    """The two RayActorGroup calls RemoteExperienceMaker makes, on one actor in this process (async_run_method_batch
    returns one list of results per actor). Records each forward's result, as the reference's log-probs do not stay
    in the experience when the KL is in the reward."""

    def __init__(self, actor: Any) -> None:
        self.actor = actor
        self.forwards: list[Any] = []

    def async_run_method_batch(self, method_name: str, **batches: list) -> list[list]:
        n = len(next(iter(batches.values())))
        results = [getattr(self.actor, method_name)(**{k: v[i] for k, v in batches.items()}) for i in range(n)]
        if method_name == "forward":
            self.forwards.extend(results)
        return [results]

    def async_run_method(self, method_name: str, **kwargs: Any) -> list:
        return [getattr(self.actor, method_name)(**kwargs)]


def responses(batch: dict) -> list[dict]:
    """The ReMax agent's response per sample (remax_agent.py AgentExecutor.execute: SingleTurnAgentExecutor's output
    with reward, scores and extra_logs), from the batch."""
    width = batch["prompt_length"]
    out = []
    for i, ids in enumerate(batch["input_ids"].tolist()):
        prompt = [t for t, a in zip(ids[:width], batch["attention_mask"][i, :width].tolist()) if a]
        length = int(batch["response_mask"][i].sum())
        action = ids[width:width + length]
        score, baseline = float(batch["scores"][i]), float(batch["baselines"][i])
        out.append({"prompt": batch["prompts"][i], "label": batch["answers"][i], "images": None,
                    "mm_train_inputs": None, "observation_tokens": prompt + action,
                    "action_ranges": [(len(prompt), len(prompt) + length)], "rollout_log_probs": None,
                    "truncated": length == batch["response_mask"].shape[1], "reward": score, "scores": score,
                    "extra_logs": {"remax_baseline": baseline}})
    return out


def response_aligned(per_action: list, batch: dict, prompt_lengths: list[int]) -> Any:
    """(rows, T) float32 of per-action tensors (OpenRLHF's action positions are the sequence's after its first
    token: a response token at sequence position p is action p - 1), 0 outside the response mask."""
    import torch

    mask = batch["response_mask"]
    rows = [row.float() for t in per_action for row in t]  # each experience is padded to its own width
    out = torch.zeros_like(mask, dtype=torch.float32)
    for i, start in enumerate(prompt_lengths):
        piece = rows[i][start - 1:start - 1 + mask.shape[1]]
        out[i, :len(piece)] = piece
    return out * mask


def master_weights(engine: Any) -> dict:
    """The optimizer's float32 copy of each parameter after the step, under the model's names, where DeepSpeed's
    wrapper keeps one (bf16 and fp16 without ZeRO: FP16_Optimizer's flat groups); {} otherwise. Not a protocol
    field: it separates the optimizer's update from the rounding of the bf16 weights the model then holds."""
    from torch._utils import _unflatten_dense_tensors

    wrapper = engine.optimizer
    if not hasattr(wrapper, "fp32_groups_flat") or not hasattr(wrapper, "fp16_groups"):
        return {}
    names = {id(p): n for n, p in engine.module.named_parameters()}
    return {names[id(p)]: w.detach().float().clone()
            for flat, group in zip(wrapper.fp32_groups_flat, wrapper.fp16_groups)
            for p, w in zip(group, _unflatten_dense_tensors(flat, group))}


def build_roles(args: Any, strategy: Any, opts: dict) -> tuple[Any, Any]:
    """The policy actor and, where the KL has a coefficient, the reference actor, loaded and ready to train."""
    from openrlhf.trainer.ray.launcher import ReferenceModelActor  # type: ignore[import-not-found]
    from openrlhf.trainer.ray.ppo_actor import PolicyModelActor  # type: ignore[import-not-found]

    # Each role gets the strategy as Ray gives it to its actor (a copy) and sets its rank up (BaseDistributedActor).
    policy = without_ray(PolicyModelActor)(1, 0, "127.0.0.1", None)
    policy.init_model_from_pretrained(copy.deepcopy(strategy), args.actor.model_name_or_path, opts["max_steps"],
                                      None)
    ref = None
    if args.algo.kl.init_coef > 0:  # train_ppo_ray.train: no reference model group otherwise
        ref = without_ray(ReferenceModelActor)(1, 0, "127.0.0.1", None)
        ref.init_model_from_pretrained(copy.deepcopy(strategy), str(opts["batch"] / "ref"))
    return policy, ref


def build_experience_maker(args: Any, strategy: Any, policy: Any, ref: Any) -> tuple[Any, Any, LocalGroup | None]:
    """The KL controller, the experience maker and the reference's group (which keeps its forwards)."""
    from openrlhf.trainer.ppo_utils import experience_maker  # type: ignore[import-not-found]
    from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker  # type: ignore[import-not-found]
    from openrlhf.trainer.ppo_utils.kl_controller import AdaptiveKLController, FixedKLController  # type: ignore[import-not-found]

    # PPOTrainer's KL controller and experience maker (trainer/ppo_trainer.py BasePPOTrainer.__init__)
    kl = args.algo.kl
    kl_ctl = (AdaptiveKLController(kl.init_coef, kl.target, kl.horizon) if kl.target
              else FixedKLController(kl.init_coef))
    groups = LocalGroup(policy), (LocalGroup(ref) if ref else None)
    maker = RemoteExperienceMaker(groups[0], None, None, groups[1], kl_ctl, strategy, policy.tokenizer)
    experience_maker.ray = SimpleNamespace(put=lambda x: x, get=lambda x: x)
    return kl_ctl, maker, groups[1]


def make_experience(maker: Any, ref_group: LocalGroup | None, batch: dict, max_len: Any) -> tuple[list, dict]:
    """The experiences of the batch's responses, and their log-probs, reference log-probs and advantages in the
    batch's (rows, T) form."""
    import torch
    from openrlhf.trainer.ppo_utils.samples_generator import SamplesGenerator  # type: ignore[import-not-found]

    # PPOTrainer's generate kwargs (train_ppo_ray.train) reach _process_response_into_experience: max_len truncates
    agent_responses = responses(batch)
    samples = [SamplesGenerator._process_response_into_experience(None, r, max_len=max_len)
               for r in agent_responses]
    experiences = maker.make_experience_batch(samples)
    prompt_lengths = [r["action_ranges"][0][0] for r in agent_responses]
    logprobs = response_aligned([e.action_log_probs for e in experiences], batch, prompt_lengths)
    advantages = response_aligned([e.advantages for e in experiences], batch, prompt_lengths)
    ref_logprobs = (response_aligned(ref_group.forwards, batch, prompt_lengths) if ref_group
                    else torch.zeros_like(logprobs))  # no reference model ran: nothing to compare
    return experiences, {"logprobs": logprobs, "ref_logprobs": ref_logprobs, "advantages": advantages}


def torch_optimizer(engine: Any) -> Any:
    """The torch optimizer inside DeepSpeed's wrapper (the engine's own where it has no wrapper)."""
    return engine.optimizer.optimizer if hasattr(engine.optimizer, "optimizer") else engine.optimizer


def train_one_step(policy: Any, experiences: list, kl_ctl: Any) -> tuple[dict, dict, dict]:
    """The actor's append and fit on the experiences, observed: the losses backward gets and the gradient norm the
    optimizer receives (record), fit's status, and the optimizer's fp32 weights before the step."""
    import torch

    trainer = policy.trainer
    engine = policy.actor.model
    record: dict = {"losses": []}
    backward = trainer.strategy.backward

    def recording_backward(loss: torch.Tensor, *a: Any, **kw: Any) -> None:
        record["losses"].append(float(loss.detach()))
        backward(loss, *a, **kw)

    trainer.strategy.backward = recording_backward
    base = torch_optimizer(engine)

    grad_norm_hook(base, record)
    before = master_weights(engine)  # the optimizer's fp32 copy starts from the weights rounded to bf16 as loaded
    for e in experiences:  # PPOTrainer.train_step: the actor group's append, then fit with kl_ctl.value
        policy.append(e)
    status = policy.fit(kl_ctl=kl_ctl.value)
    return record, status, before


def collect_output(args: Any, policy: Any, ref: Any, kl_ctl: Any, per_token: dict, step: tuple[dict, dict, dict],
                   t0: float) -> dict:
    """The update in the protocol's form, from the per-token outputs and train_one_step's observations."""
    record, status, before = step
    trainer = policy.trainer
    engine = policy.actor.model
    base = torch_optimizer(engine)
    kl = args.algo.kl
    weights = {n: p.detach().float().clone() for n, p in engine.module.named_parameters()}
    master = master_weights(engine)
    groups_settings = [{"lr": g["lr"], "betas": list(g.get("betas", ())), "eps": g.get("eps"),
                        "weight_decay": g.get("weight_decay"), "params": len(g["params"])}
                       for g in base.param_groups]
    return {
        **per_token,
        "loss": sum(record["losses"]), "grad_norm": float(status["actor_grad_norm"]),
        "applied_grad_norm": record.get("applied_grad_norm", float("nan")),
        # the optimizer's fp32 copy where DeepSpeed keeps one (the update itself; the bf16 weights round it, ~lr at
        # |w| ~ 0.1), measured from its own start; else the module's weights
        "weights": master or weights, **({"weights_before": before, "weights_bf16": weights} if master else {}),
        "precision": {"bf16": "bf16", "fp16": "fp16"}.get(args.ds.param_dtype, "fp32"),
        "calls": CALLS,
        "settings": {
            "optimizer": f"{type(engine.optimizer).__module__}.{type(engine.optimizer).__name__} around "
                         f"{type(base).__module__}.{type(base).__name__}",
            "param_groups": groups_settings,
            "lr_scheduler": args.actor.lr_scheduler, "lr_warmup_ratio": args.actor.lr_warmup_ratio,
            "loss": f"PolicyLoss {args.actor.policy_loss_type}, {args.actor.loss_agg_mode} over the optimizer step's "
                    f"tokens (eps_clip {list(args.actor.eps_clip_low_high)}, dual_clip {args.actor.dual_clip})",
            "grad_clip": engine.gradient_clipping(),
            "kl": f"{'loss' if kl.use_loss else 'in the reward'}, {kl.estimator}, coefficient {kl_ctl.value}"
                  f"{'' if ref else ' (no reference model: train_ppo_ray builds none for a coefficient of 0)'}",
            "advantage": f"{args.algo.advantage.estimator}, gamma {args.algo.advantage.gamma}, reward clip "
                         f"{list(args.reward.clip_range)}",
            "zero_stage": args.ds.zero_stage, "param_dtype": args.ds.param_dtype,
            "grad_accum_dtype": args.ds.grad_accum_dtype, "attn_implementation": args.ds.attn_implementation,
            "packing_samples": args.ds.packing_samples, "micro_batch_size": args.train.micro_batch_size,
            "train_batch_size": args.train.batch_size, "accumulation": trainer.strategy.accumulated_gradient,
            "optimizer_steps": engine.global_steps, "policy_loss_logged": status.get("policy_loss"),
            "entropy_coef": args.actor.entropy_coef, "seed": args.train.seed,
            "wall_s": round(time.time() - t0, 2),
        },
    }


def main() -> None:
    opts, flags = own_options(sys.argv[1:])
    start_under(opts["env"])
    t0 = time.time()
    import torch
    from openrlhf.utils import get_strategy

    batch = torch.load(opts["batch"] / "batch.pt", weights_only=True)
    args = parse_flags(flags)
    strategy = get_strategy(args)
    policy, ref = build_roles(args, strategy, opts)
    kl_ctl, maker, ref_group = build_experience_maker(args, strategy, policy, ref)
    experiences, per_token = make_experience(maker, ref_group, batch, args.data.max_len)
    step = train_one_step(policy, experiences, kl_ctl)
    torch.save(collect_output(args, policy, ref, kl_ctl, per_token, step, t0), opts["out"])

if __name__ == "__main__":
    main()
