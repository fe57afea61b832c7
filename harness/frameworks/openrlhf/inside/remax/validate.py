"""OpenRLHF 0.11.2's own code, run without a GPU: its argument parser and the patched "remax" advantage step.

Run with the python of an environment that has openrlhf (the CPU one, `openrlhf-validate`, with stand-ins for the
GPU-only vllm and flash_attn on PYTHONPATH; the repository on PYTHONPATH for harness.conformance):

    python validate.py parse-args OUT.json -- [train_ppo_ray arguments...]
    python validate.py conformance OUT.json [--ray-worker]

parse-args: runs `openrlhf.cli.train_ppo_ray` as __main__ through runpy, so its argparse definitions and its own
post-parse checks and rewrites run unchanged; `openrlhf.utils.get_strategy`, the first call of `train()` once Ray
is up, is replaced by a function that captures the parsed arguments and stops the run, `ray.is_initialized`
answers True so that `train()` does not start Ray, and `ray.init` fails if reached. An unknown flag exits 2 with
argparse's message, as on a real launch. Writes the parsed arguments as nested JSON.

conformance: runs the installed (patched) `RemoteExperienceMaker.compute_advantages_and_returns` with
`--algo.advantage.estimator remax`, the arguments parsed as above, on each case of
harness.conformance.CASES, and
writes {case: {"advantages": [[...]], "reference": [[...]], "scalar_reward": bool}}. With --ray-worker the cases
run inside a task of a local Ray cluster, in a worker process that imports openrlhf afresh, as the PPOTrainer actor
does on a real run: the patch must be in the installed files to be seen there.
"""

import json
import runpy
import sys
from types import SimpleNamespace


class Captured(Exception):
    pass


def parsed_args(argv):
    """The namespace train_ppo_ray builds from `argv`, captured before Ray would start."""
    import openrlhf.utils
    import ray

    def capture(args):
        raise Captured(args)

    def never_start_ray(*args, **kwargs):
        raise AssertionError("ray.init reached: the arguments were not captured before Ray would start")

    saved = openrlhf.utils.get_strategy, ray.is_initialized, ray.init, sys.argv
    openrlhf.utils.get_strategy, ray.is_initialized, ray.init = capture, (lambda: True), never_start_ray
    sys.argv = ["train_ppo_ray", *argv]
    try:
        runpy.run_module("openrlhf.cli.train_ppo_ray", run_name="__main__", alter_sys=True)
    except Captured as c:
        return c.args[0]
    finally:
        openrlhf.utils.get_strategy, ray.is_initialized, ray.init, sys.argv = saved
    raise AssertionError("train_ppo_ray returned without calling get_strategy")


def as_dict(ns):
    return {k: as_dict(v) if isinstance(v, SimpleNamespace) else v for k, v in vars(ns).items()}


def remax_advantages(case, args):
    """Advantages from OpenRLHF's experience maker for one conformance case (one prompt per response)."""
    import torch
    from openrlhf.trainer.ppo_utils.experience import Experience
    from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker
    from openrlhf.trainer.ppo_utils.kl_controller import FixedKLController

    mask = torch.tensor(case["mask"], dtype=torch.bool)
    # OpenRLHF takes one scalar reward per sample (a multi-turn agent sums its turns' rewards into it).
    if "token_scores" in case:
        rewards = (torch.tensor(case["token_scores"]) * mask).sum(-1)
    else:
        rewards = torch.tensor(case["scores"], dtype=torch.float32)
    experience = Experience(
        action_mask=mask, rewards=rewards, kl=torch.tensor(case["kl"], dtype=torch.float32),
        index=list(range(len(mask))), info={"remax_baseline": torch.tensor(case["baselines"], dtype=torch.float32)},
    )
    maker = RemoteExperienceMaker(None, None, None, None, FixedKLController(case["kl_coef"]),
                                  SimpleNamespace(args=args), tokenizer=None)
    [experience] = maker.compute_advantages_and_returns([experience])
    return experience.advantages


def conformance():
    from harness.conformance import CASES, reference_advantages

    out = {}
    for name, case in CASES.items():
        args = parsed_args(["--actor.model_name_or_path", "unused", "--algo.advantage.estimator", "remax",
                            "--rollout.n_samples_per_prompt", "1", "--algo.kl.init_coef", str(case["kl_coef"])])
        out[name] = {"advantages": remax_advantages(case, args).tolist(),
                     "reference": reference_advantages(case).tolist(),
                     "scalar_reward": "token_scores" in case}
    return out


def main():
    command, dest, *rest = sys.argv[1:]
    if command == "parse-args":
        if rest[:1] != ["--"]:
            raise SystemExit(__doc__)
        result = as_dict(parsed_args(rest[1:]))
    elif command == "conformance" and rest in ([], ["--ray-worker"]):
        if rest:
            import os

            import ray

            # The worker must find the stand-ins and the harness exactly as this process does.
            ray.init(num_cpus=1, include_dashboard=False, log_to_driver=True,
                     runtime_env={"env_vars": {"PYTHONPATH": os.environ.get("PYTHONPATH", "")}})
            try:
                result = ray.get(ray.remote(conformance).remote())
            finally:
                ray.shutdown()
        else:
            result = conformance()
    else:
        raise SystemExit(__doc__)
    with open(dest, "w") as f:
        json.dump(result, f, indent=2, default=repr)


if __name__ == "__main__":
    main()
