"""DeepSpeed-Chat adapter: the official ReMax code (GitHub liziniu/ReMax, pinned commit; built on DeepSpeed-Chat).

The modules, by stage of the data flow:
- plan.py: a launch directory for `step3_rlhf_finetuning/main.py --algo remax` under the `deepspeed` launcher, run
  through inside/launcher.py (which times DeepSpeed's hybrid engine and scores with the shared reward); the shared
  dataset exported in DeepSpeed-Chat's `local/jsonfile` layout; settings the code breaks on refused up front.
- ingest.py: the launcher's JSON lines (measured), and DeepSpeed-Chat's own printed lines (perf.py
  `print_throughput_step3`, main.py's `Average reward score:` line) as a cross-check, or as estimated rows where
  nothing else exists.
- conformance.py: ReMax's own return computation (`DeepSpeedReMaxTrainer.compute_loss`, imported from the checkout)
  on the shared vectors, against the reference advantage.
inside/ holds what runs in DeepSpeed-Chat's own environment, not the harness's: launcher.py with its reward client
(reward_client.py), and conformance_driver.py.

The shared reward replaces DeepSpeed-Chat's reward engine (reward_client.SharedReward). A reward model
(`reward.kind: model`) is always served: launch.sh starts the shared reward server on the checkpoint and the
launcher posts decoded prompt + response texts to it ("served"), so the checkpoint scores DeepSpeed-Chat with the
same forward pass as the other frameworks. DeepSpeed-Chat's native reward engine cannot take the shared
checkpoint: utils/model/model_utils.py `create_critic_model` builds `AutoModel` + the `v_head` of
utils/model/reward_model.py `RewardModel` and loads the state dict of `pytorch_model.bin` with DeepSpeed-Chat's own
key names (a Hugging Face *ForSequenceClassification checkpoint keeps its head as `score` in safetensors), and it
feeds the actor's token ids to that model unchanged, which would also require the policy's tokenizer. No planned
path hands token ids across models, so no tokenizer has to match.
"""

from __future__ import annotations

from pathlib import Path

from harness.frameworks.dschat import conformance, ingest, parity, plan
from harness.frameworks.dschat.plan import CPU_ENV, ENV, NAME, REMAX_COMMIT
from harness.frameworks.registry import Adapter, Checkout, register_framework

# The ReMax repository carries the DeepSpeed-Chat code it runs (utils/, step3's perf.py): nothing else is needed.
REMAX_FOLDERS = ("step3_rlhf_finetuning", "utils")


# Read in the official ReMax code at REMAX_COMMIT.
register_framework(Adapter(
    name=NAME,
    no_rollout_logprobs="it samples with the trained actor itself (HF generate in DeepSpeed's hybrid engine) and keeps "
                        "no log-prob of the sampler: not 0 by construction, since its hard-coded top-p 0.9 gives a "
                        "sampled token a larger log-prob than the trainer's full softmax does",
    one_node="the deepspeed launcher needs a hostfile of the nodes for more, which this adapter does not write",
    description="DeepSpeed-Chat: the official ReMax code (liziniu/ReMax 536ba49) under the deepspeed launcher, "
                "timed and scored by the harness launcher",
    ingest=ingest.ingest,
    evaluation=ingest.evaluation,
    log_glob="*.log",
    plan=plan.plan,
    env=ENV,
    cpu_env=CPU_ENV,
    check_env=CPU_ENV,
    own_throughput="perf.py's Samples/sec x Total Seq. Length: the configured maximum prompt + answer length, not "
                   "the tokens generated, over its End-to-End latency (time.time() without device sync); above the "
                   "harness's figure whenever answers stop before the maximum",
    conformance=conformance.conformance,
    parity=parity.parity,
    module="deepspeed",
    saves_checkpoint=True,  # the final actor, to --output_dir in the run directory
    schema=Path(__file__).with_name("config.schema.yaml"),
    image=Path(__file__).with_name("image.yaml"),
    checkout=Checkout(REMAX_COMMIT, REMAX_FOLDERS),
    ports=lambda config: [("dschat.master_port", "127.0.0.1", config[NAME]["master_port"])],
))
