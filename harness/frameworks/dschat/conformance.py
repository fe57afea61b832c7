"""The DeepSpeed-Chat conformance check: ReMax's own return computation (`DeepSpeedReMaxTrainer.compute_loss`,
imported from the checkout by conformance_driver.py in the dschat CPU environment) on the shared vectors, against
the reference advantage.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
from pathlib import Path
from typing import Any

import pandas as pd

from harness import HarnessError
from harness.frameworks.dschat.plan import CPU_ENV, NAME, checkout_dir, require_checkout
from harness.runtime.envs import ensure_env

# Beyond the shared vectors: the two settings that make DeepSpeed-Chat's ReMax differ where the shared cases
# cannot show it (the rule reward stays within [0, 1], and the shared spec has no discount).
EXTRA_CASES = {
    "dschat:reward_beyond_clip": {
        "description": "reward - baseline beyond +-5 (a reward model's scale): DeepSpeed-Chat clips it",
        "mask": [[1, 1, 1, 0], [1, 1, 0, 0]],
        "scores": [8.0, -7.0],
        "baselines": [0.5, 0.0],
        "kl": [[0.0] * 4] * 2,
        "kl_coef": 0.0,
    },
}
OFFICIAL_GAMMA = 0.99  # training_scripts/llama2/run_llama2_7b.sh at 536ba49


def conformance_cases(config_gamma: float = 1.0) -> dict[str, tuple[dict, float]]:
    from harness.conformance import CASES

    cases = {name: (case, config_gamma) for name, case in {**CASES, **EXTRA_CASES}.items()}
    cases["outcome@gamma_0.99"] = (CASES["outcome"], OFFICIAL_GAMMA)
    return cases


CONFORMANCE_DRIVER = Path(__file__).with_name("inside") / "conformance_driver.py"


def conformance(config: dict | None = None) -> pd.DataFrame:
    """ReMax's own returns (the weights of log-probs in its loss) vs the reference advantage, per vector.

    Runs DeepSpeedReMaxTrainer.compute_loss from the pinned checkout in the dschat CPU environment; without the
    checkout every row says so (verdict "not run"), nothing is computed in its place.
    """
    import torch

    from harness.conformance import reference_advantages
    from harness.conformance import verdict as conformance_verdict

    gamma = float((config or {}).get(NAME, {}).get("gamma", 1.0))
    cases = conformance_cases(gamma)
    try:
        checkout = require_checkout(checkout_dir(config))
    except HarnessError as e:
        return pd.DataFrame([{"framework": NAME, "case": name, "max_abs_diff": math.nan, "verdict": "not run",
                              "note": str(e)} for name in cases])
    payload: dict[str, dict[str, Any]] = {name: {"case": case, "gamma": g,
                      "scores": case.get("scores") or [sum(r) for r in case["token_scores"]]}
               for name, (case, g) in cases.items()}
    proc = subprocess.run([str(ensure_env(CPU_ENV)), str(CONFORMANCE_DRIVER), str(checkout)],
                          input=json.dumps(payload), capture_output=True, text=True,
                          env={**os.environ, "DS_ACCELERATOR": "cpu", "PYTHONPATH": ""})
    if proc.returncode:
        raise HarnessError(f"{checkout}: running ReMax's compute_loss failed:\n{proc.stderr[-3000:]}")
    theirs = json.loads(proc.stdout.strip().splitlines()[-1])
    rows = []
    for name, (case, g) in cases.items():
        ref = reference_advantages(case)
        diff = float((torch.tensor(theirs[name]["returns"]) - ref).abs().max())
        notes = []
        if case["kl_coef"] and any(any(v for v in row) for row in case["kl"]):
            notes.append("per-token KL in the return at that token only (reference: KL summed to go)")
        if "token_scores" in case:
            notes.append("one score per response (the dense scores summed, applied at the end)")
        if any(abs(s - b) > theirs[name]["clip"] for s, b in zip(payload[name]["scores"], case["baselines"])):
            notes.append(f"reward - baseline clipped to +-{theirs[name]['clip']:g}")
        if g != 1.0:
            notes.append(f"gamma {g:g}: clipped reward discounted by gamma^(T-t+1)")
        verdict = conformance_verdict(diff)
        rows.append({"framework": NAME, "case": name, "max_abs_diff": diff, "verdict": verdict,
                     "note": "; ".join(notes) if verdict == "differs" else ""})
    return pd.DataFrame(rows)
