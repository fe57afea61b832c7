"""Greedy accuracy of an OpenRLHF run before and after training, decoded by vLLM, the engine OpenRLHF generates with.

OpenRLHF 0.11.2 evaluates only after training steps (ppo_trainer.py: global_step % eval.steps), by sampled reward
(pass@k). This decodes the shared dataset's eval prompts greedily from the initial policy and from the actor OpenRLHF
saved (--ckpt.output_dir, the run directory's ckpt/), with the requests the ReMax agent makes: BOS as the shared
tokenizer adds it, the response budget of --rollout.max_new_tokens, min_tokens as in the agent. Scored by the task's
exact match (harness.reward.correct) and the shared rule reward. The "before" responses are what step-0 agreement
compares with the reference backend's. Run with the run's environment (harness.frameworks.openrlhf.ingest.evaluation),
after the run: nothing here is timed. On a CPU plan the layer's patched reload_weights packs the tied output layer
again after loading the saved actor (harness/frameworks/openrlhf/inside/cpu).

Usage: python greedy_eval.py RUN_DIR OUT_JSON
"""

import json
import os
import sys
import tempfile
from pathlib import Path

from harness import reward


def flag(argv, name):
    return argv[argv.index(name) + 1]


def main(run_dir, out):
    from vllm import LLM, SamplingParams

    plan = json.loads((run_dir / "plan.json").read_text())
    argv = plan["argv"]
    policy, max_new = flag(argv, "--actor.model_name_or_path"), int(flag(argv, "--rollout.max_new_tokens"))
    agent = json.loads((Path(flag(argv, "--train.agent_func_path")).with_name("remax_agent.json")).read_text())
    with open(plan["inputs"]["dataset"]["path"]) as f:
        rows = [r for r in map(json.loads, f) if r["split"] == "eval"]
    params = SamplingParams(temperature=0.0, max_tokens=max_new,
                            min_tokens=max_new if agent["min_tokens_is_max_tokens"] else 0)
    llm = LLM(model=policy, dtype="bfloat16", seed=plan["seed"], enforce_eager=True,
              max_model_len=int(flag(argv, "--data.max_len")), gpu_memory_utilization=0.5)
    tokenizer = llm.get_tokenizer()

    def point():
        prompts = [{"prompt_token_ids": tokenizer(r["prompt"])["input_ids"]} for r in rows]
        texts = [o.outputs[0].text for o in llm.generate(prompts, params, use_tqdm=False)]
        return {"greedy_accuracy": sum(reward.correct(t, r["answer"]) for t, r in zip(texts, rows)) / len(rows),
                "reward_mean": sum(reward.score(r["prompt"], t, r["answer"]) for t, r in zip(texts, rows)) / len(rows),
                "n": len(rows), "responses": [{"prompt": r["prompt"], "response": t} for r, t in zip(rows, texts)]}

    record = {"before": point()}
    llm.collective_rpc("reload_weights", kwargs={"weights_path": str(run_dir / "ckpt")})
    record["after"] = point()
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.")
    with os.fdopen(fd, "w") as f:
        json.dump(record, f)
    os.replace(tmp, out)


if __name__ == "__main__":
    main(Path(sys.argv[1]).resolve(), Path(sys.argv[2]).resolve())
