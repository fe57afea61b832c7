"""Model FLOPs utilisation (MFU): the FLOPs a step's tokens need by the model's own shape, over the hardware's peak.

Model FLOPs per token of a forward pass, as PaLM counts them (Chowdhery et al. 2022, appendix B: 6N + 12LHQT per
training token, three times 2N + 4LHQT), with the attention term over the keys a causal token actually sees:

    2 * N  +  4 * L * d_attn * c

N: the weights that enter a matmul (every layer's q, k, v, o and MLP projections, and the output head; the
embedding lookup is not a matmul), L: layers, d_attn: heads x head_dim, c: the keys the token attends to (its
position + 1). A backward pass costs twice a forward, so training is 3x. Counted per ReMax step from the metrics'
token counts (the same for every framework): generation is a forward over every sampled and greedy sequence,
prompt included; the reference forward one over every sampled sequence; training three over every sampled
sequence. These are model FLOPs, as MFU defines them: work an engine saves (a prompt's keys and values shared by
its samples, prefix caching) is not deducted, so it shows as a higher MFU, and recomputation is not added.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from harness import HarnessError
from harness.checkpoint import checkpoint_config
from harness.io import read_json_object

# Dense peak FLOP/s per GPU from NVIDIA's data sheets (A100: "NVIDIA A100 Tensor Core GPU" data sheet, SXM;
# H100 and H200: the H100 / H200 data sheets, SXM; without sparsity). fp32 is the TF32 tensor-core figure, what
# torch uses for fp32 matmuls when TF32 is allowed, the frameworks' default.
GPU_PEAK_TFLOPS = {
    "A100": {"bf16": 312.0, "fp16": 312.0, "fp32": 156.0},
    "H100": {"bf16": 989.4, "fp16": 989.4, "fp32": 494.7},
    "H200": {"bf16": 989.4, "fp16": 989.4, "fp32": 494.7},
}


SHAPE_FIELDS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size")


@dataclass(frozen=True)
class ModelShape:
    matmul_params: int  # N
    layers: int  # L
    attention_width: int  # d_attn = heads x head_dim

    def forward_flops(self, prompt: float, response: float, sequences: float,
                      prompt_runs: float | None = None) -> float:
        """FLOPs of a forward over `sequences` sequences of `prompt` + `response` tokens (mean lengths); the prompt
        part runs `prompt_runs` times (default: once per sequence; a shared prefix runs once per prompt)."""
        prompt_runs = sequences if prompt_runs is None else prompt_runs
        # Keys attended, summed over a sequence's tokens: 1 + 2 + ... for the prompt, then prompt + t per response
        # token t.
        prompt_keys = prompt * (prompt + 1) / 2
        response_keys = response * prompt + response * (response + 1) / 2
        per_key = 4 * self.layers * self.attention_width
        return (prompt_runs * (2 * self.matmul_params * prompt + per_key * prompt_keys)
                + sequences * (2 * self.matmul_params * response + per_key * response_keys))


def model_shape(config_path: str | Path) -> ModelShape:
    """The shape of a Hugging Face decoder from its config.json (Llama-family names: the frameworks' policies)."""
    config_path = Path(config_path)
    try:
        c = checkpoint_config(config_path.parent, "policy config", required=SHAPE_FIELDS,
                              optional=("head_dim", "num_key_value_heads"))
    except HarnessError as e:
        raise HarnessError(f"{config_path}: cannot read the model's shape "
                           f"({str(e).removeprefix(f'{config_path}: ')})") from None
    hidden, layers, heads = c["hidden_size"], c["num_hidden_layers"], c["num_attention_heads"]
    head_dim = c.get("head_dim") or hidden // heads
    kv_heads = c.get("num_key_value_heads") or heads
    per_layer = hidden * head_dim * (2 * heads + 2 * kv_heads) + 3 * hidden * c["intermediate_size"]
    return ModelShape(layers * per_layer + hidden * c["vocab_size"], layers, heads * head_dim)


def step_flops(shape: ModelShape, *, tokens_prompt: float, tokens_response: float, tokens_baseline: float,
               prompts: int, samples_per_prompt: int) -> dict[str, float]:
    """Model FLOPs of one ReMax step by phase, from its token counts (the metrics' definitions: prompt tokens once
    per sample, response tokens of the samples, greedy tokens)."""
    sampled = prompts * samples_per_prompt
    prompt, response, greedy = tokens_prompt / sampled, tokens_response / sampled, tokens_baseline / prompts
    sampled_forward = shape.forward_flops(prompt, response, sampled)
    gen = sampled_forward + shape.forward_flops(prompt, greedy, prompts)
    return {"gen": gen, "ref": sampled_forward, "train": 3 * sampled_forward, "step": gen + 4 * sampled_forward}


def gpu_peak(name: str, dtype: str) -> float | None:
    """Peak FLOP/s of a GPU by its name (e.g. "NVIDIA A100-SXM4-80GB") at `dtype`, or None when not in the table."""
    for model, peaks in GPU_PEAK_TFLOPS.items():
        if model in name.upper():
            return peaks[dtype] * 1e12
    return None


def run_peak(run_dir: Path, n_gpus: int) -> tuple[float | None, str]:
    """The peak FLOP/s a run is measured against, and where it comes from: the run's own record (the reference
    backend measures the CPU or names its GPU), else the data-sheet peak of the GPUs its manifest lists, at bf16
    (the frameworks' training dtype here), times the run's GPUs."""
    path = Path(run_dir) / "manifest.json"
    try:
        manifest = read_json_object(path, "manifest")
    except HarnessError as e:
        return None, f"no peak: {e}"
    if "peak_flops" in manifest:
        record = manifest["peak_flops"]
        flops = record.get("flops") if isinstance(record, dict) else None
        if not isinstance(flops, (int, float)) or isinstance(flops, bool) or flops <= 0 \
                or not isinstance(record.get("source"), str):
            return None, f"no peak: {path}: peak_flops should be {{flops: a number above 0, source: a string}}"
        return float(flops), record["source"]
    hardware = manifest.get("hardware", {})
    gpus = hardware.get("gpus") or [] if isinstance(hardware, dict) else None
    if not isinstance(gpus, list) or not all(isinstance(g, str) for g in gpus):
        return None, f"no peak: {path}: hardware.gpus should be a list of GPU names"
    peak = gpu_peak(gpus[0], "bf16") if gpus else None
    if peak is None:
        return None, f"no peak: {gpus[0]} is not in the GPU table" if gpus else "no peak: a CPU run, not measured"
    return peak * n_gpus, f"{gpus[0]} bf16 data-sheet peak x {n_gpus}"


def framework_cpu_peak(dtype: str) -> dict:
    """The peak a framework's CPU run is measured against: `dtype` matmuls (the dtype it trains in) on every core,
    as its processes use them, measured in the run's timed slot before it starts. On a CPU with bf16 instructions
    (avx512_bf16, AMX) the bf16 rate is many times the fp32 one, so the dtype matters as much as on a GPU."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(os.cpu_count() or 1)
    try:
        flops = cpu_matmul_peak(dtype=dtype)
        return {"flops": flops, "source": f"measured: {dtype} 512x512 matmuls on {torch.get_num_threads()} torch "
                                          "threads (all cores), before the run"}
    finally:
        torch.set_num_threads(threads)


def cpu_matmul_peak(seconds: float = 0.3, size: int = 512, dtype: str = "fp32") -> float:
    """FLOP/s of `dtype` matmuls on this process's torch threads, now: the best of a few timed batches."""
    import torch

    g = torch.Generator().manual_seed(0)  # its own: the run's random stream stays untouched
    torch_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype]
    a, b = (torch.randn(size, size, generator=g).to(torch_dtype) for _ in range(2))
    a @ b  # first call allocates and picks its kernel
    best, deadline = 0.0, time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        start = time.perf_counter()
        for _ in range(4):
            a @ b
        best = max(best, 4 * 2 * size ** 3 / (time.perf_counter() - start))
    return best
