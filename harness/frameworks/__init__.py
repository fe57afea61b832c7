"""The framework adapters: the registry (registry.py, the interface every adapter fills in) and one package per
framework, which registers itself when imported here. Everything outside this package reaches the adapters through
the names below; nothing outside it knows framework names.
"""

from harness.frameworks import dschat, openrlhf, reference, verl
from harness.frameworks.registry import (
    PLAN_IDENTITY,
    VLLM_HEAD_DIMS,
    Adapter,
    conformance_env,
    environment,
    get_adapter,
    known_frameworks,
    not_runnable,
    on_cpu,
    register_framework,
    run_plan,
)

__all__ = [
    "PLAN_IDENTITY",
    "VLLM_HEAD_DIMS",
    "Adapter",
    "conformance_env",
    "dschat",
    "environment",
    "get_adapter",
    "known_frameworks",
    "not_runnable",
    "on_cpu",
    "openrlhf",
    "reference",
    "register_framework",
    "run_plan",
    "verl",
]
