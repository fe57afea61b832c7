"""verl.plugins entry point: a CPU platform for verl's platform registry, and two fixes below verl.

verl 0.9.1 registers nvidia, npu and rocm platforms only and falls back to cuda + nccl otherwise
(verl/plugin/platform/platform_manager.py); VERL_PLATFORM=cpu selects the platform registered here.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from contextlib import nullcontext

from remax_bench_verl_cpu import ACTIVE


def _cpu_device_module():
    """torch.cpu, with the accelerator-memory calls verl makes on its device module (verl/utils/memory_utils.py,
    engine workers: empty_cache, mem_get_info, memory statistics, rng state). A CPU has no device memory apart from
    the host's: the statistics read 0, mem_get_info the host's free and total memory."""
    import types

    import torch

    module = types.ModuleType("remax_bench_verl_cpu.device")
    module.__dict__.update({k: v for k, v in vars(torch.cpu).items() if not k.startswith("__")})

    def mem_get_info(device=None):
        pages, free = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_AVPHYS_PAGES")
        size = os.sysconf("SC_PAGE_SIZE")
        return free * size, pages * size

    zero = lambda *args, **kwargs: 0  # noqa: E731
    nothing = lambda *args, **kwargs: None  # noqa: E731
    module.__dict__.update(
        empty_cache=nothing, ipc_collect=nothing, set_per_process_memory_fraction=nothing,
        reset_peak_memory_stats=nothing, memory_allocated=zero, memory_reserved=zero, max_memory_allocated=zero,
        max_memory_reserved=zero, mem_get_info=mem_get_info, get_device_name=lambda *a, **k: "cpu",
        get_rng_state=lambda *a, **k: torch.get_rng_state(),
        set_rng_state=lambda state, *a, **k: torch.set_rng_state(state),
    )
    return module


def _cpu_platform():
    import torch
    from verl.plugin.platform.platform_base import PlatformBase
    from verl.plugin.platform.platform_manager import PlatformRegistry

    @PlatformRegistry.register(platform="cpu")
    class PlatformCPU(PlatformBase):
        """The host CPU as verl's one device. Ray schedules workers on a pretend GPU (ray_init.num_gpus in the
        plan), so the resource name stays "GPU"; the device index verl passes to `.to()` is the CPU device."""

        device_name = "cpu"
        vendor_name = "cpu"
        device_module = _cpu_device_module()

        def is_available(self) -> bool:
            return True

        def is_platform_available(self, use_smi_check=False) -> bool:
            return True

        def current_device(self):
            # verl moves tensors with `.to(get_device_id())`; an int would mean cuda:N.
            return torch.device("cpu")

        def device_count(self) -> int:
            return 1

        def set_device(self, device_index) -> None:
            pass

        def synchronize(self, device_index=None) -> None:
            pass  # CPU kernels finish before they return

        def manual_seed(self, seed: int) -> None:
            torch.manual_seed(seed)

        def manual_seed_all(self, seed: int) -> None:
            torch.manual_seed(seed)

        def set_allocator_settings(self, settings: str) -> None:
            pass

        def empty_cache(self) -> None:
            pass

        def get_device_capability(self, device_index: int = 0):
            return None, None

        def communication_backend_name(self) -> str:
            return "gloo"

        def visible_devices_envvar(self) -> str:
            return "CUDA_VISIBLE_DEVICES"  # what Ray sets for the pretend GPU; nothing reads it on a CPU

        def nvtx_range(self, msg: str):
            return nullcontext()

        def profiler_start(self) -> None:
            pass

        def profiler_stop(self) -> None:
            pass

        def ray_resource_name(self) -> str:
            return "GPU"

        def ray_noset_envvars(self) -> list[str]:
            return ["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"]

        def is_ipc_supported(self) -> bool:
            return False

        def cudart(self):
            return None

    return PlatformCPU


def _single_backend_per_device() -> None:
    """verl asks for `cpu:gloo,{device}:{backend}` (verl/utils/distributed.py), which on the CPU names the cpu
    device twice and torch refuses ("Duplicate device type cpu"). Each device's first backend is kept."""
    import torch.distributed as dist

    original = dist.init_process_group

    def init_process_group(*args, **kwargs):
        backend = kwargs.get("backend")
        if isinstance(backend, str) and "," in backend:
            per_device = {}
            for part in backend.split(","):
                device, _, name = part.partition(":")
                per_device.setdefault(device, name)
            kwargs["backend"] = ",".join(f"{d}:{b}" for d, b in per_device.items())
        return original(*args, **kwargs)

    dist.init_process_group = init_process_group


def _unpinned_cpu_offload() -> None:
    """verl's FSDP2 reference model always offloads with CPUOffloadPolicy(pin_memory=True)
    (verl/workers/engine/fsdp/transformer_impl.py); pinning host memory needs an accelerator. verl.utils.fsdp_utils
    imports the class from torch.distributed.fsdp after this runs, so it gets one that never pins."""
    import torch.distributed.fsdp as fsdp

    @dataclasses.dataclass
    class CPUOffloadPolicy(fsdp.CPUOffloadPolicy):
        def __post_init__(self):
            self.pin_memory = False

    fsdp.CPUOffloadPolicy = CPUOffloadPolicy


def register() -> None:
    if not ACTIVE:
        return
    try:
        _cpu_platform()
        _single_backend_per_device()
        _unpinned_cpu_offload()
    except Exception as e:  # verl swallows a plugin's exception into a debug log: say it where users look
        print(f"remax-bench verl CPU layer failed to load: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        raise


register()
