"""The verl conformance check: verl's own ReMax advantage (conformance_driver.py, in verl's environment) on the
shared vectors against the reference.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
from pathlib import Path

import pandas as pd

from harness import HarnessError
from harness.frameworks.registry import conformance_env, get_adapter
from harness.frameworks.verl.plan import NAME
from harness.runtime.envs import REPO, ensure_env

CONFORMANCE_DRIVER = Path(__file__).with_name("inside") / "conformance_driver.py"


def run_verl_conformance(python: Path) -> dict:
    proc = subprocess.run([str(python), str(CONFORMANCE_DRIVER)], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=REPO)
    if proc.returncode:
        raise HarnessError(f"verl conformance script failed in {python}:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout)


def conformance(config: dict | None = None) -> pd.DataFrame:
    """verl's ReMax advantage on harness.conformance.CASES vs the reference, one row per case (no
    setting of the config changes verl's ReMax advantage)."""
    import torch  # here, not with the module: the registry imports this module for every stage, which need no torch

    from harness.conformance import CASES, reference_advantages, verdict

    env = conformance_env(get_adapter(NAME), config)
    assert env is not None
    verl_out = run_verl_conformance(ensure_env(env))
    rows = []
    for name, case in CASES.items():
        ours = reference_advantages(case)
        theirs = torch.tensor(verl_out[name])
        diff = float((theirs - ours).abs().max())
        note = case["description"]
        if "token_scores" in case:
            mask = torch.tensor(case["mask"], dtype=torch.float32)
            drift = float(((theirs - theirs[:, :1]) * mask).abs().max())
            note += (f"; verl, like the reference, subtracts the greedy response's summed reward from the sampled "
                     f"reward-to-go at every token, so later tokens compare a partial sampled return with the full "
                     f"greedy return: within one response the advantage moves by up to {drift:.4g} from its first "
                     f"token's (the sequence-level advantage)")
        rows.append({"framework": NAME, "case": name, "max_abs_diff": diff,
                     "verdict": verdict(diff), "note": note})
    # ReMax has no advantage without the greedy baselines (the reference cannot be called without them): verl
    # conforms when it refuses such a batch, and differs when it computes advantages anyway.
    refused = verl_out["missing_baseline"]
    rows.append({"framework": NAME, "case": "missing_baseline", "max_abs_diff": math.nan,
                 "verdict": "match" if refused else "differs",
                 "note": f"a batch without reward_baselines: verl raises {refused} (inside the advantage step, after "
                         "generation and reward)" if refused else
                         "a batch without reward_baselines: verl computes advantages without the greedy baseline"})
    return pd.DataFrame(rows)
