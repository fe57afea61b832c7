"""TRL adapter: ReMax on TRL 1.16 (PyPI `trl`), with the ReMax trainer the harness ships for it (inside/remax_trl.py).

TRL has GRPO and RLOO but no ReMax; remax_trl.ReMaxTrainer is TRL's RLOOTrainer with ReMax's greedy baseline and
per-token advantage.

The modules, by stage of the data flow:
- plan.py: a launch directory that runs remax_trl.py in the TRL environment (one process on a CPU;
  `accelerate launch`, one process per GPU, on a node).
- ingest.py: the trainer's step records (measured, the harness's clock around TRL's own code), with TRL's own
  printed log line of each step (transformers' PrinterCallback: the `Trainer.log` dict) as the cross-check.
- conformance.py: the advantage function the trainer calls, on the shared vectors, and a batch of each real run (the
  first with a KL to the reference) with the advantages the trainer computed there.
- parity.py: one update of the trainer by TRL's own training loop on harness.parity's fixed batch
  (inside/parity_driver.py in the TRL environment).
inside/ holds what runs in TRL's own environment, not the harness's: remax_trl.py, conformance_driver.py and
parity_driver.py.
"""

from __future__ import annotations

from pathlib import Path

from harness.frameworks.registry import Adapter, register_framework
from harness.frameworks.trl import conformance, ingest, parity, plan
from harness.frameworks.trl.plan import NAME, STEPS_LOG

register_framework(Adapter(
    name=NAME,
    no_rollout_logprobs="it samples with the trained model itself (HF generate with a KV cache, no vLLM) and keeps no "
                        "log-prob of the sampler: at temperature 1 and top-p 1 the two differ by rounding only",
    one_node="this adapter starts one node's processes (accelerate launch without a machine list)",
    description="TRL 1.16 (RLOOTrainer) with the harness's ReMax trainer: greedy baseline, per-token advantage",
    ingest=ingest.ingest,
    evaluation=ingest.evaluation,
    log_glob=STEPS_LOG,
    plan=plan.plan,
    env="trl",
    cpu_env="trl-cpu",
    check_env="trl-cpu",
    cpu_dtype="fp32",
    own_throughput="TRL's num_tokens (prompt and completion tokens of every generation, the greedy responses "
                   "included) over its step_time (training_step, generation included, the optimizer step not): "
                   "about twice the harness's figure, which counts no greedy tokens",
    conformance=conformance.conformance,
    run_conformance=conformance.run_conformance,
    parity=parity.parity,
    module="trl",
    schema=Path(__file__).with_name("config.schema.yaml"),
    image=Path(__file__).with_name("image.yaml"),
))
