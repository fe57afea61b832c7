"""The TRL conformance check: the advantage function the trainer calls (remax_trl.remax_advantages, through
conformance_driver.py in the TRL environment) on the shared vectors, and a batch of each real run (the first with a
KL to the reference) with the advantages the trainer computed there, against the reference.
"""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import pandas as pd

from harness import HarnessError
from harness.frameworks.registry import conformance_env, get_adapter, run_plan
from harness.frameworks.trl.plan import BATCH_LOG, NAME
from harness.io import read_json_object
from harness.runtime.envs import ensure_env

CONFORMANCE_DRIVER = Path(__file__).with_name("inside") / "conformance_driver.py"


def conformance(config: dict | None = None) -> pd.DataFrame:
    """remax_trl.remax_advantages, the function the trainer calls, on the shared vectors, in the TRL environment."""
    import torch

    from harness.conformance import CASES, reference_advantages, verdict

    cases = {name: case for name, case in CASES.items() if "token_scores" not in case}
    env = conformance_env(get_adapter(NAME), config)
    assert env is not None
    proc = subprocess.run([str(ensure_env(env)), "-P", str(CONFORMANCE_DRIVER)], input=json.dumps(cases),
                          capture_output=True, text=True)
    if proc.returncode:
        raise HarnessError(f"{CONFORMANCE_DRIVER}: failed in {env}:\n{proc.stderr[-3000:]}")
    theirs = json.loads(proc.stdout.strip().splitlines()[-1])
    rows = []
    for name, case in CASES.items():
        if name not in cases:
            rows.append({"framework": NAME, "case": name, "max_abs_diff": math.nan, "verdict": "not applicable",
                         "note": "the trainer's reward functions give one score per response"})
            continue
        diff = float((torch.tensor(theirs[name]) - reference_advantages(case)).abs().max())
        rows.append({"framework": NAME, "case": name, "max_abs_diff": diff, "verdict": verdict(diff), "note": ""})
    return pd.DataFrame(rows)


def run_conformance(run_dir: Path) -> pd.DataFrame | None:
    """The advantages the trainer computed in the run's first step whose policy had moved from the reference (so the
    KL term counts), on the batch it saw, against the reference ReMax on that batch."""
    import torch

    from harness.conformance import reference_advantages, verdict

    path = Path(run_dir) / BATCH_LOG
    if not path.is_file():
        return None
    try:
        case = read_json_object(path, "recorded advantage batch")
        diff = float((reference_advantages(case) - torch.tensor(case["advantages"])).abs().max())
    except (json.JSONDecodeError, KeyError, TypeError, ValueError, RuntimeError) as e:
        raise HarnessError(f"{path}: not a recorded advantage batch ({e!r})") from None
    return pd.DataFrame([{"framework": NAME, "case": f"step {case['step']} of {run_plan(path, NAME)['run_id']} "
                                                    f"({len(case['scores'])} samples)",
                          "max_abs_diff": diff, "verdict": verdict(diff),
                          "note": "ReMaxTrainer in the run, on the batch it saw", "source": "from a real run"}])
