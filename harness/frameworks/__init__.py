"""The framework adapters: the registry (registry.py, the interface every adapter fills in) and one package per
framework, which the registry finds and imports on first use. Everything outside this package reaches the adapters
through the names below; nothing outside a framework's folder knows its name.
"""

from harness.frameworks.registry import (
    PLAN_IDENTITY,
    VLLM_HEAD_DIMS,
    Adapter,
    Checkout,
    config_blocks,
    conformance_env,
    env_spec,
    environment,
    get_adapter,
    image_defaults,
    known_frameworks,
    not_runnable,
    on_cpu,
    read_plan,
    refuse_foreign_checkout,
    register_framework,
    run_id,
    run_plan,
    sources,
    write_plan,
)

__all__ = [
    "PLAN_IDENTITY",
    "VLLM_HEAD_DIMS",
    "Adapter",
    "Checkout",
    "config_blocks",
    "conformance_env",
    "env_spec",
    "environment",
    "get_adapter",
    "image_defaults",
    "known_frameworks",
    "not_runnable",
    "on_cpu",
    "read_plan",
    "refuse_foreign_checkout",
    "register_framework",
    "run_id",
    "run_plan",
    "sources",
    "write_plan",
]
