"""Registry of framework adapters: each framework is one module behind the same small interface.

An adapter says how to get a run (an embedded `run`, or a `plan` for a real framework's launch directory),
how to turn that run's own logs into the common schema (`ingest`), and what it needs (`needs_gpu`).
Nothing outside this package knows framework names.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import pandas as pd

from harness import HarnessError


@dataclass(frozen=True)
class Adapter:
    name: str
    description: str
    ingest: Callable[[Sequence[Path], int | None], pd.DataFrame]  # (logs, n_gpus) -> common schema
    log_glob: str  # the run's own logs inside its run directory
    run: Callable[..., None] | None = None  # embedded backends: (config, seed, out_dir, inputs_dir)
    plan: Callable[..., None] | None = None  # real frameworks: write a launch directory
    needs_gpu: bool = False
    env: str | None = None  # name of its pinned environment, workflows/envs/<env>.txt (real frameworks)
    # (): DataFrame with columns framework, case, max_abs_diff, verdict, note (harness.conformance vectors)
    conformance: Callable[[], pd.DataFrame] | None = None


_REGISTRY: dict[str, Adapter] = {}


def register_framework(adapter: Adapter) -> Adapter:
    if adapter.name in _REGISTRY:
        raise ValueError(f"framework adapter {adapter.name!r} is already registered")
    _REGISTRY[adapter.name] = adapter
    return adapter


def known_frameworks() -> list[str]:
    return sorted(_REGISTRY)


def get_adapter(name: str) -> Adapter:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise HarnessError(f"unknown framework {name!r} (known: {', '.join(known_frameworks())})") from None


from harness.frameworks import dschat, openrlhf, reference, verl  # noqa: E402,F401  (each registers itself)
