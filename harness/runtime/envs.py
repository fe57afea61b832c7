"""Per-framework Python environments, built from pinned descriptions in each framework's own folder:
harness/frameworks/<framework>/envs/<name>.txt (a framework is one folder), or the envs/ of a framework installed as a
package of its own (the folder the registry passes down with add_framework_folder as it registers that adapter).

verl, OpenRLHF and DeepSpeed-Chat pin conflicting torch/transformers/ray/deepspeed, so each gets its own venv
under .venvs/<name>, never the harness's. A description is a pip requirements file; lines starting with
`#!env ` set environment variables for the install (e.g. `#!env DS_BUILD_OPS=0`), and two kinds of line are
installed after the requirements, one package each: `#!no-deps PKG==V` without its dependencies (a package whose
own pins cannot install here), `#!no-build-isolation PKG==V` against the torch already installed (flash-attn
builds its CUDA kernels that way), `#!local PATH` a project of this repository (PATH relative to it), without its
dependencies. `#!digest PATH` names a file of this repository that the environment's contents depend on without
installing it (a patch applied to an installed package). An environment is built once and reused; it is rebuilt
when its description, a local project in it or a digest file changes (the stamp holds the sha256 of each).
A GPU description has a full lock beside it (envs/NAME.lock, harness.runtime.locks): the environment is then
installed from the lock, every file's sha256 required, before the post-install lines, and the lock's sha256 is part
of the environment's digest.
With `container.runtime: apptainer` an image of the framework's published image, with the same description installed,
takes the venv's place (harness/runtime/container.py, whose env_command gives a launch command its prefix either
way).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from harness import HarnessError
from harness.io import locked, sha256_file, write_text
from harness.runtime import locks

REPO = Path(__file__).resolve().parents[2]
FRAMEWORK_FOLDERS = REPO / "harness" / "frameworks"  # each framework's envs/, found by path: runtime imports no adapter
# REMAX_BENCH_ENVS: another folder of environments, for one process tree (`remax-bench ab` gives each arm its own, so
# that an arm's framework version is the one its runs launch with).
ENV_ROOT = Path(os.environ.get("REMAX_BENCH_ENVS") or REPO / ".venvs")
STAMP = ".remax-bench-env"
# What a built environment's package list and `env NAME --out`'s file of its python are (harness.io.WRITTEN).
STAMP_ROLE = "environment stamp"
PYTHON_ROLE = "environment's python path"
TORCH_EXTENSIONS = "torch_extensions"  # each venv's own cache of torch's JIT-built ops (container.env_check)


# The folders of the frameworks installed as packages of their own, each with its envs/: the registry passes each
# one down as it registers its adapter (runtime imports no adapter), so a process finds their descriptions once the
# registry has looked its frameworks up.
INSTALLED_FOLDERS: list[Path] = []


def add_framework_folder(folder: Path) -> None:
    """Search `folder`/envs/ for descriptions too: the folder of a framework installed as a package of its own."""
    folder = Path(folder).resolve()
    if folder not in INSTALLED_FOLDERS:
        INSTALLED_FOLDERS.append(folder)


def _descriptions(folders: Path, pattern: str) -> list[Path]:
    found = {*folders.glob(f"*/envs/{pattern}"), *(p for f in INSTALLED_FOLDERS for p in f.glob(f"envs/{pattern}"))}
    return sorted(found)


def spec_path(name: str, tree: Path | None = None) -> Path:
    """The description of environment `name` in this checkout, or in `tree` (another checkout: an A/B arm's), or
    in an installed framework's folder (INSTALLED_FOLDERS). A checkout from before 2026-12-04 kept every description
    in workflows/envs/, where bisect still finds them."""
    folders = FRAMEWORK_FOLDERS if tree is None else tree / "harness" / "frameworks"
    found = _descriptions(folders, f"{name}.txt")
    if tree is not None and not found and (tree / "workflows" / "envs" / f"{name}.txt").is_file():
        found = [tree / "workflows" / "envs" / f"{name}.txt"]
    if len(found) == 1:
        return found[0]
    if found:
        raise HarnessError(f"environment {name!r} is described twice: {', '.join(map(str, found))}")
    known = sorted(p.stem for p in _descriptions(folders, "*.txt"))
    where = ", ".join([f"{folders}/*/envs/{name}.txt", *(f"{f}/envs/{name}.txt" for f in INSTALLED_FOLDERS)])
    raise HarnessError(f"{where}: no environment description named {name!r} (known: {', '.join(known)})")


def pinned_version(name: str, package: str) -> str:
    """The version environment `name` pins `package` to (a PKG==V line of its description)."""
    path = spec_path(name)
    for line in path.read_text().splitlines():
        pkg, sep, version = line.strip().partition("==")
        if sep and pkg.lower() == package:
            return version
    raise HarnessError(f"{path}: no pinned {package}")


def install_env_vars(spec: Path) -> dict[str, str]:
    out = {}
    for lineno, line in enumerate(spec.read_text().splitlines(), 1):
        if line.startswith("#!env "):
            key, sep, value = line[len("#!env "):].strip().partition("=")
            if not sep or not key:
                raise HarnessError(f"{spec}:{lineno}: expected '#!env KEY=VALUE'")
            out[key] = value
    return out


POST_INSTALL = {"#!no-deps ": "--no-deps", "#!no-build-isolation ": "--no-build-isolation", "#!local ": "--no-deps"}
LOCAL = "#!local "
DIGEST = "#!digest "


def local_projects(spec: Path, repo: Path = REPO) -> list[Path]:
    """The repository projects a description installs (`#!local PATH`, relative to `repo`), as absolute paths."""
    paths = []
    for lineno, line in enumerate(spec.read_text().splitlines(), 1):
        if line.startswith(LOCAL):
            path = repo / line[len(LOCAL):].strip()
            if not (path / "pyproject.toml").is_file():
                raise HarnessError(f"{spec}:{lineno}: {path} is not a project of this repository (no pyproject.toml)")
            paths.append(path)
    return paths


def post_install(spec: Path, repo: Path = REPO) -> list[tuple[str, str]]:
    """(pip flag, requirement) for each post-install line, in file order; a local project as its absolute path."""
    out = []
    for line in spec.read_text().splitlines():
        for prefix, flag in POST_INSTALL.items():
            if line.startswith(prefix):
                req = line[len(prefix):].strip()
                out.append((flag, str(repo / req) if prefix == LOCAL else req))
    return out


def project_digest(path: Path) -> str:
    """A local project's source: its pyproject.toml and Python files, not what building it leaves beside them
    (pip builds in place: build/, *.egg-info, __pycache__)."""
    h = hashlib.sha256()
    files = [path / "pyproject.toml", *(p for p in path.rglob("*.py")
                                        if not {"build", "__pycache__"} & set(p.relative_to(path).parts))]
    for f in sorted(files):
        h.update(f"{f.relative_to(path).as_posix()}\0{sha256_file(f)}\n".encode())
    return h.hexdigest()


def digest_files(spec: Path, repo: Path = REPO) -> list[Path]:
    """The repository files a description names with `#!digest PATH`."""
    paths = []
    for lineno, line in enumerate(spec.read_text().splitlines(), 1):
        if line.startswith(DIGEST):
            path = repo / line[len(DIGEST):].strip()
            if not path.is_file():
                raise HarnessError(f"{spec}:{lineno}: {path} is not a file of this repository")
            paths.append(path)
    return paths


def env_digest(spec: Path, repo: Path = REPO) -> str:
    """What an environment is built from: its description, the source of each local project it installs and the
    files it names with `#!digest` (paths relative to `repo`, the checkout the description belongs to), and its
    lock where it has one."""
    lock = locks.lock_of(spec)
    parts = [sha256_file(spec), *(project_digest(p) for p in local_projects(spec, repo)),
             *(sha256_file(p) for p in digest_files(spec, repo)), *([f"lock {sha256_file(lock)}"] if lock else [])]
    return parts[0] if len(parts) == 1 else hashlib.sha256(" ".join(parts).encode()).hexdigest()


def pip_steps(spec: Path, pip: list[str], spec_as: str | None = None, repo: Path = REPO,
              locked_in: Path | None = None) -> list[list[str]]:
    """The pip commands that install a description: its requirements, then each post-install line. `spec_as` is
    the description's path where the commands run (inside an image under construction). `locked_in`: a folder
    where the description's lock is split for pip (locks.install_files): the environment is then installed from
    the lock, hashes required and nothing resolved, and a `#!no-build-isolation` package in the lock comes from it."""
    lock = locks.lock_of(spec)
    if lock is None or locked_in is None:
        return [[*pip, "-r", spec_as or str(spec)], *([*pip, flag, req] for flag, req in post_install(spec, repo))]
    from_lock = locks.built_here(spec) & locks.parse_lock(lock.read_text()).keys()
    steps = [[*pip, "--require-hashes", "--no-deps", *flags, "-r", str(f)]
             for flags, f in locks.install_files(spec, lock, locked_in)]
    rest = [(flag, req) for flag, req in post_install(spec, repo)
            if not (flag == "--no-build-isolation" and locks.normalize(re.split(r"[=<>!~\[ ]", req)[0]) in from_lock)]
    return [*steps, *([*pip, flag, req] for flag, req in rest)]


def env_python(name: str, root: Path = ENV_ROOT) -> Path:
    return root / name / "bin" / "python"


def ensure_env(name: str, root: Path | None = None, python: str = sys.executable, spec: Path | None = None,
               repo: Path = REPO) -> Path:
    """The venv for `name` under `root` (default ENV_ROOT), built (or rebuilt after a change of its description) if
    needed; returns its python. `spec`: a description other than the framework's envs/NAME.txt (another version of the
    framework), its `#!local` and `#!digest` paths relative to `repo`."""
    root = root or ENV_ROOT
    spec = spec or spec_path(name)
    digest = env_digest(spec, repo)
    root.mkdir(parents=True, exist_ok=True)
    with locked(root / f".{name}.lock"):  # a second process waits for the build, then finds it made
        return _build(name, root, python, spec, repo, digest)


def _build(name: str, root: Path, python: str, spec: Path, repo: Path, digest: str) -> Path:
    venv = root / name
    stamp = venv / STAMP
    if stamp.is_file() and stamp.read_text().strip() == digest:
        return env_python(name, root)
    # A venv cannot be moved after it is built, so it is built in place and marked complete by the stamp,
    # written last: a half-built venv has no stamp and is rebuilt from scratch.
    if venv.is_symlink():  # another folder's environment lent to this root (`ab`): never built over
        venv.unlink()
    shutil.rmtree(venv, ignore_errors=True)
    env = {**os.environ, **install_env_vars(spec)}
    pip = [str(env_python(name, root)), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    with tempfile.TemporaryDirectory(prefix=f".{name}-", dir=root) as split:
        steps = [[python, "-m", "venv", str(venv)], *pip_steps(spec, pip, repo=repo, locked_in=Path(split))]
        for cmd in steps:
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if proc.returncode:
                output = proc.stdout + proc.stderr
                refused = locks.hash_mismatch(output) if "--require-hashes" in cmd else None
                if refused:
                    raise HarnessError(f"{locks.lock_path(spec)}: {refused}: the file pip got does not match the "
                                       f"lock's sha256; environment {name!r} left unfinished (no stamp, never used). "
                                       f"If PyPI replaced the file, run `remax-bench env lock {name}` and review "
                                       f"the change:\n" + output[-3000:])
                raise HarnessError(f"{spec}: building environment {name!r} failed ({' '.join(cmd[:4])} ...):\n"
                                   + output[-3000:])
    write_text(stamp, digest + "\n", role=STAMP_ROLE)
    return env_python(name, root)
