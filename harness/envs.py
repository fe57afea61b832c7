"""Per-framework Python environments, built from pinned descriptions in workflows/envs/<name>.txt.

verl, OpenRLHF and DeepSpeed-Chat pin conflicting torch/transformers/ray/deepspeed, so each gets its own venv
under .venvs/<name>, never the harness's. A description is a pip requirements file; lines starting with
`#!env ` set environment variables for the install (e.g. `#!env DS_BUILD_OPS=0`), and two kinds of line are
installed after the requirements, one package each: `#!no-deps PKG==V` without its dependencies (a package whose
own pins cannot install here), `#!no-build-isolation PKG==V` against the torch already installed (flash-attn
builds its CUDA kernels that way). An environment is built
once and reused; it is rebuilt when its description changes (the stamp holds the description's sha256).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from harness import HarnessError
from harness.io import sha256_file, write_text

REPO = Path(__file__).resolve().parents[1]
ENV_SPECS = REPO / "workflows" / "envs"
ENV_ROOT = REPO / ".venvs"
STAMP = ".remax-bench-env"


def spec_path(name: str) -> Path:
    path = ENV_SPECS / f"{name}.txt"
    if not path.is_file():
        known = sorted(p.stem for p in ENV_SPECS.glob("*.txt"))
        raise HarnessError(f"{path}: no environment description named {name!r} (known: {', '.join(known)})")
    return path


def install_env_vars(spec: Path) -> dict[str, str]:
    out = {}
    for lineno, line in enumerate(spec.read_text().splitlines(), 1):
        if line.startswith("#!env "):
            key, sep, value = line[len("#!env "):].strip().partition("=")
            if not sep or not key:
                raise HarnessError(f"{spec}:{lineno}: expected '#!env KEY=VALUE'")
            out[key] = value
    return out


POST_INSTALL = {"#!no-deps ": "--no-deps", "#!no-build-isolation ": "--no-build-isolation"}


def post_install(spec: Path) -> list[tuple[str, str]]:
    """(pip flag, requirement) for each `#!no-deps` / `#!no-build-isolation` line, in file order."""
    return [(flag, line[len(prefix):].strip()) for line in spec.read_text().splitlines()
            for prefix, flag in POST_INSTALL.items() if line.startswith(prefix)]


def env_python(name: str, root: Path = ENV_ROOT) -> Path:
    return root / name / "bin" / "python"


def ensure_env(name: str, root: Path = ENV_ROOT, python: str = sys.executable) -> Path:
    """The venv for `name`, built (or rebuilt after a change of its description) if needed; returns its python."""
    spec = spec_path(name)
    venv = root / name
    digest = sha256_file(spec)
    stamp = venv / STAMP
    if stamp.is_file() and stamp.read_text().strip() == digest:
        return env_python(name, root)
    # A venv cannot be moved after it is built, so it is built in place and marked complete by the stamp,
    # written last: a half-built venv has no stamp and is rebuilt from scratch.
    shutil.rmtree(venv, ignore_errors=True)
    env = {**os.environ, **install_env_vars(spec)}
    pip = [str(env_python(name, root)), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    steps = [[python, "-m", "venv", str(venv)], [*pip, "-r", str(spec)]]
    steps += [[*pip, flag, req] for flag, req in post_install(spec)]
    for cmd in steps:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if proc.returncode:
            raise HarnessError(f"{spec}: building environment {name!r} failed ({' '.join(cmd[:4])} ...):\n"
                               + (proc.stdout + proc.stderr)[-3000:])
    write_text(stamp, digest + "\n")
    return env_python(name, root)
