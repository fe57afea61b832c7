"""Provenance of a run: what code, which inputs (by sha256), which machine, which seed and config."""

from __future__ import annotations

import datetime as dt
import importlib.metadata
import os
import platform
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import harness
from harness import HarnessError
from harness.io import config_hash
from harness.runtime.git import git

PACKAGES = ("torch", "transformers", "tokenizers", "numpy", "pandas", "pyarrow")
REPO = Path(__file__).resolve().parents[2]
MANIFEST_ROLE = "run manifest"  # what a run's manifest.json is (harness.io.WRITTEN)


def package_versions(names: Iterable[str] = PACKAGES) -> dict[str, str | None]:
    out: dict[str, str | None] = {"harness": harness.__version__, "python": platform.python_version()}
    for name in names:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def git_commit() -> dict:
    try:
        return {"commit": git(REPO, "rev-parse", "HEAD"),
                "dirty": bool(git(REPO, "status", "--porcelain", "--untracked-files=no"))}
    except (HarnessError, FileNotFoundError):
        return {"commit": None, "dirty": None}


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def hardware() -> dict:
    hw: dict[str, Any] = {"cpu": cpu_model(), "cpu_count": os.cpu_count(), "machine": platform.machine(), "gpus": []}
    try:
        import torch

        if torch.cuda.is_available():
            hw["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    except ImportError:
        pass
    return hw


def build_manifest(*, framework: str, framework_version: str, run_id: str, seed: int, config: dict,
                   inputs: dict[str, dict], extra: dict | None = None) -> dict:
    return {
        "framework": framework,
        "framework_version": framework_version,
        "run_id": run_id,
        "seed": seed,
        "profile": config["profile"],
        "config_hash": config_hash(config),
        "config": config,
        "inputs": inputs,
        "versions": package_versions(),
        "hardware": hardware(),
        "git": git_commit(),
        "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        **(extra or {}),
    }
