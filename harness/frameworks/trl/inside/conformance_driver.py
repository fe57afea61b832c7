"""Runs in the TRL environment: remax_trl.remax_advantages, the function ReMaxTrainer calls, on the cases given as
JSON on stdin ({name: case}); prints {name: advantages} as one JSON line. Called by harness.frameworks.trl."""

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from remax_trl import remax_advantages  # type: ignore[import-not-found]  # beside this file, found at run time

out = {}
for name, case in json.load(sys.stdin).items():
    kl = torch.tensor(case["kl"], dtype=torch.float32)
    out[name] = remax_advantages(torch.tensor(case["scores"], dtype=torch.float32),
                                 torch.tensor(case["baselines"], dtype=torch.float32), kl, torch.zeros_like(kl),
                                 torch.tensor(case["mask"], dtype=torch.float32), float(case["kl_coef"])).tolist()
print(json.dumps(out))
