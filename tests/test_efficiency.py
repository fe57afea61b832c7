"""Model FLOPs and MFU: the formula against torch's own FLOP counter on a real reference step, the peak table, and
the MFU columns the pipeline writes."""

import pandas as pd
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from harness.frameworks.reference.model import Decoder, generate, response_logprobs
from harness.inputs.policy import build_policy, train_tokenizer
from harness.results.efficiency import ModelShape, gpu_peak, model_shape


def test_forward_flops_by_hand():
    shape = ModelShape(matmul_params=100, layers=1, attention_width=2)
    # prompt of 2: 2*100*2 + 4*1*2*(1+2); one response token seeing 3 keys: 2*100 + 4*1*2*3
    assert shape.forward_flops(prompt=2, response=1, sequences=1) == 400 + 24 + 200 + 24
    # three sequences sharing one prompt run: the prompt counts once
    assert shape.forward_flops(prompt=2, response=1, sequences=3, prompt_runs=1) == 424 + 3 * 224


def test_the_formula_agrees_with_torchs_flop_counter_on_a_reference_step(tmp_path):
    """Each phase of one step of the reference backend's decoder, counted by torch, against the formula applied to
    the tokens that phase really processed (padded prompt width, decoded width, a prompt shared by its samples)."""
    torch.manual_seed(0)
    pairs = [(a, b) for a in range(10, 40, 3) for b in range(5)]
    texts = [f"{a}+{b}=" for a, b in pairs]
    tokenizer = train_tokenizer([f"{a}+{b}={a + b}" for a, b in pairs], 32)
    build_policy(tokenizer, {"hidden_size": 64, "intermediate_size": 256, "num_layers": 2, "num_heads": 4},
                 32).save_pretrained(tmp_path)
    shape = model_shape(tmp_path / "config.json")
    from transformers import AutoModelForCausalLM

    policy = AutoModelForCausalLM.from_pretrained(tmp_path)
    trainer, rollout = Decoder(policy), Decoder(policy).requires_grad_(False)
    tokenizer.padding_side = "left"
    enc = tokenizer(texts[:16], padding=True, return_tensors="pt")
    ids, attn, n = enc["input_ids"], enc["attention_mask"], 8
    prompts, width = ids.shape

    with FlopCounterMode(display=False) as counter:
        out = generate(rollout, ids, attn, n=n, greedy=True, max_new_tokens=8, temperature=1.0, top_p=1.0,
                       eos_id=tokenizer.eos_token_id, pad_id=tokenizer.pad_token_id)
    decoded = out.shape[1]
    expected = {"generation": shape.forward_flops(width, decoded - 1, prompts * (n + 1), prompt_runs=prompts)}
    measured = {"generation": counter.get_total_flops()}
    response = out[:prompts * n]
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        response_logprobs(rollout, ids, attn, response, n)
    expected["reference forward"] = shape.forward_flops(width, decoded - 1, prompts * n, prompt_runs=prompts)
    measured["reference forward"] = counter.get_total_flops()
    with FlopCounterMode(display=False) as counter:
        response_logprobs(trainer, ids, attn, response, n).sum().backward()
    expected["training"] = 3 * expected["reference forward"]
    measured["training"] = counter.get_total_flops()
    for phase in expected:
        assert measured[phase] == pytest.approx(expected[phase], rel=0.10), (phase, measured, expected)


def test_peaks_come_from_the_data_sheets_by_gpu_name():
    assert gpu_peak("NVIDIA A100-SXM4-80GB", "bf16") == 312e12
    assert gpu_peak("NVIDIA H200", "bf16") == pytest.approx(989.4e12)
    assert gpu_peak("Tesla V100-SXM2-32GB", "bf16") is None


def test_the_pipeline_reports_mfu_against_the_measured_cpu_peak(micro_pipeline):
    results = micro_pipeline / "results"
    summary = pd.read_csv(results / "summary.csv")
    assert summary["peak_source"].str.startswith("measured: fp32 512x512 matmuls").all()
    for phase in ("mfu_gen", "mfu_train", "mfu_step"):
        assert ((summary[phase] > 0) & (summary[phase] < 1)).all(), summary[phase]
    # The report shows the same MFU (median over seeds) as the summary, not an empty cell.
    table = (results / "report" / "throughput.md").read_text()
    assert "MFU step (gen / train)" in table
    cell = table.splitlines()[2].rstrip(" |").split(" | ")[-1]
    medians = summary[["mfu_step", "mfu_gen", "mfu_train"]].median()
    assert cell == f"{medians.mfu_step:.1%} ({medians.mfu_gen:.1%} / {medians.mfu_train:.1%})"


def test_a_policy_whose_shape_cannot_be_read_leaves_mfu_empty_and_says_why(micro_pipeline, tmp_path):
    from conftest import run_cli

    results = micro_pipeline / "results"
    (tmp_path / "policy").mkdir()
    (tmp_path / "policy" / "config.json").write_text("{}")
    runs = sorted((results / "runs" / "reference").iterdir())
    proc = run_cli("summarize", "--config", results / "config.json", "--metrics",
                   *sorted((results / "metrics" / "reference").glob("*.parquet")), "--runs", *runs,
                   "--policy", tmp_path / "policy", "--out", tmp_path / "summary.csv")
    assert proc.returncode == 0, proc.stderr
    summary = pd.read_csv(tmp_path / "summary.csv")
    assert summary["mfu_step"].isna().all() and (summary["throughput_tok_s"] > 0).all()
    assert summary["peak_source"].str.contains("no MFU: .*config.json: cannot read the model's shape").all()
