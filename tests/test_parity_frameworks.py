"""Update parity with the frameworks' own training code: one `remax-bench parity` (the pipeline's rule) over verl,
OpenRLHF and TRL (and DeepSpeed-Chat where its checkout is given: REMAX_BENCH_REMAX_CHECKOUT), each in its runs' own
environment, on the cpu-frameworks profile shrunk to 8 prompts a step. The drivers start torch.distributed process
groups (one process each), so this file runs in the unit of real framework runs (conftest.FRAMEWORK_RUNS); the planted
changes, TRL's only, run beside it (tests/test_parity_planted.py).

The figures these assert come from the frameworks' real code paths (docs/frameworks.md, "Update parity", has the
cpu-frameworks batch's): verl's and OpenRLHF's forward runs in bf16 on the CPU as their CPU runs do, TRL's in fp32.
"""

from __future__ import annotations

import os

import pandas as pd
import pytest
from conftest import make_inputs, parity_config, run_cli

CHECKOUT = os.environ.get("REMAX_BENCH_REMAX_CHECKOUT")


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("parity")
    path, _ = make_inputs(root, parity_config(CHECKOUT))
    return {"root": root, "config": path, "inputs": root / "inputs"}


@pytest.fixture(scope="module")
def parity(inputs):
    out = inputs["root"] / "parity"
    proc = run_cli("parity", "--config", inputs["config"], "--inputs", inputs["inputs"], "--out", out)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    table = pd.read_csv(out / "parity.csv", keep_default_na=False, na_values=[""])
    return {"table": table, "stdout": proc.stdout,
            "verdicts": {(r.framework, r.quantity): r.verdict for r in table.itertuples()},
            "notes": {(r.framework, r.quantity): r.note for r in table.itertuples()}}


def test_each_framework_makes_the_reference_update_or_the_cause_is_named(parity):
    v, notes = parity["verdicts"], parity["notes"]
    expected = {"logprobs": "match", "ref_logprobs": "match", "advantages": "match", "grad_norm": "match",
                "applied_grad_norm": "match"}
    for fw in ("verl", "openrlhf", "trl"):
        assert {q: v[fw, q] for q in expected} == expected, parity["table"][parity["table"]["framework"] == fw]
    # TRL (fp32, the harness's trainer on TRL's loop): the same update, to fp32 rounding
    assert v["trl", "loss"] == "match" and v["trl", "update"] == "match"
    assert "\ntrl: the same update: " in parity["stdout"]
    # verl and OpenRLHF report PPO's surrogate loss: another value, the same gradient
    for fw in ("verl", "openrlhf"):
        assert v[fw, "loss"] == "explained" and notes[fw, "loss"].startswith("token mean (PPO's surrogate")
    assert v["verl", "update"] == "match"
    # OpenRLHF's first update on the CPU profile (bf16, ZeRO 0) is Adam's second step: DeepSpeed stepped at build
    assert v["openrlhf", "update"] == "differs" and "Adam's second step" in notes["openrlhf", "update"]
    if CHECKOUT:  # the official ReMax code: the KL at its own token, and a clip hard-coded at 1.0
        assert v["dschat", "advantages"] == "differs" and notes["dschat", "advantages"].startswith(
            "the KL penalty only at its own token")
        assert "(the framework holds 1.0)" in notes["dschat", "applied_grad_norm"]


def test_the_report_shows_the_same_update_table(parity):
    from harness.report.page import parity_view

    view = parity_view(parity["table"])
    lines = {f["framework"]: f["summary"] for f in view["frameworks"]}
    assert lines["trl"].startswith("the same update") and "update differs" in lines["openrlhf"]
    assert all(len(f["rows"]) == 7 for f in view["frameworks"])
