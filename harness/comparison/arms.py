"""The two arms of an A/B (`remax-bench ab`, `bisect`, `nightly`): each a commit of this repository with its own
checkout, frozen config and, for a planned framework, its own environment; its runs trained by its own code through
its own CLI, so that each arm's verdict names the code that ran.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from harness import HarnessError
from harness.frameworks import get_adapter
from harness.frameworks.registry import environment
from harness.io import read_json_object
from harness.runtime import envs
from harness.runtime.git import git, is_commit_id
from harness.runtime.git import run as run_git

# The config sections the shared inputs are built from: arms that differ in them would not train on the same inputs.
INPUT_SECTIONS = ("task", "policy", "reward")
TRAIN_MODULE = "harness/runs/train.py"  # where an arm's harness trains a run (one owner of the sequence)


@dataclass
class Arm:
    label: str
    spec: str  # as given: a git ref or a checkout's path
    override: dict = field(default_factory=dict)
    commit: str = ""
    tree: Path | None = None  # the checkout its code runs from
    worktree: bool = False  # made by this comparison (removed at the end)
    config: Path | None = None
    envs: dict[str, Path] = field(default_factory=dict)  # environment name -> its description (a framework version)
    env_root: Path | None = None  # the folder of environments its runs launch with (REMAX_BENCH_ENVS)
    built: dict[str, dict] = field(default_factory=dict)  # what each environment of its runs was made from
    ports: dict = field(default_factory=dict)  # its fixed ports moved apart for runs side by side (separate_ports)


def merge(into: dict, over: dict) -> dict:
    """`over` laid over `into`, section by section."""
    out = dict(into)
    for k, v in over.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def differences(a: object, b: object, path: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b)) for d in differences(a.get(k), b.get(k), f"{path}.{k}".lstrip("."))]
    return [] if a == b else [f"{path}: {a!r} against {b!r}"]


def resolve_arm(arm: Arm, repo: Path, where: Path) -> None:
    """The arm's commit and the checkout it runs from; refused, naming the arm, for an unknown ref, a checkout with
    uncommitted changes (its code would not be the commit the verdict names) or a missing environment description."""
    for name, spec in arm.envs.items():
        if not spec.is_file():
            raise HarnessError(f"arm {arm.label}: --{arm.label.lower()}-env {name}={spec}: no such description file")
        arm.envs[name] = spec.resolve()
    given = Path(arm.spec)
    try:  # a name past the system's limits (a ref of 300 characters) is no folder
        checkout = given.is_dir() and (given / "harness").is_dir()
    except OSError:
        checkout = False
    if checkout:
        status = git(given, "status", "--porcelain", "--untracked-files=no")
        if status:
            raise HarnessError(f"arm {arm.label}: {given} has uncommitted changes ({status.splitlines()[0].strip()} "
                               "...): commit them, or give a ref, so that the verdict names the code that ran")
        arm.commit, arm.tree = git(given, "rev-parse", "HEAD"), given.resolve()
        return
    # --end-of-options: a ref named like an option is looked up as a ref, never read as one
    proc = run_git(repo, "rev-parse", "--verify", "--quiet", "--end-of-options", f"{arm.spec}^{{commit}}")
    if proc.returncode or not is_commit_id(proc.stdout.strip()):
        raise HarnessError(f"arm {arm.label}: {arm.spec!r} is not a commit of {repo} (git rev-parse found nothing)")
    arm.commit, arm.tree, arm.worktree = proc.stdout.strip(), where, True


def start(arm: Arm, *args: object, log: Path, cores: list[int] | None = None) -> subprocess.Popen:
    """This arm's own CLI (its checkout first on the path) started, output to `log`, on `cores` where given."""
    assert arm.tree is not None
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(arm.tree), os.environ.get("PYTHONPATH")) if p),
           **({"REMAX_BENCH_ENVS": str(arm.env_root)} if arm.env_root else {})}
    with open(log, "a") as f:
        # -P: the current directory (where relative paths of the config point) stays off the import path
        return subprocess.Popen([sys.executable, "-P", "-m", "harness.cli", *map(str, args)], env=env, stdout=f,
                                stderr=subprocess.STDOUT,
                                preexec_fn=(lambda: os.sched_setaffinity(0, cores)) if cores else None)


def finish(arm: Arm, proc: subprocess.Popen, log: Path, command: object) -> None:
    """Wait for a started CLI; a failure names the arm, the command and the log."""
    if proc.wait():
        tail = log.read_text(errors="replace")[-2000:]
        raise HarnessError(f"arm {arm.label} ({arm.commit[:12]}): `remax-bench {command}` exited {proc.returncode} "
                           f"(log {log}):\n{tail}")


def cli(arm: Arm, *args: object, log: Path) -> None:
    finish(arm, start(arm, *args, log=log), log, args[0])


def arm_environment(arm: Arm, name: str, root: Path, made: dict[str, Path], say: Callable[[str], None]) -> dict:
    """Environment `name` for the arm's runs, in `root`: from the arm's description (--X-env), else from its own
    checkout's. One built from the same description (the shared one in envs.ENV_ROOT, or the other arm's) is lent
    as a link, not built again; `made` maps each description's digest to the environment built from it."""
    assert arm.tree is not None
    try:
        spec = arm.envs.get(name) or envs.spec_path(name, arm.tree)
    except HarnessError as e:
        raise HarnessError(f"arm {arm.label} ({arm.commit[:12]}): {e}") from None
    digest = envs.env_digest(spec, arm.tree)
    root.mkdir(parents=True, exist_ok=True)
    if digest not in made and digest == envs.env_digest(envs.spec_path(name)):
        envs.ensure_env(name)  # this checkout's own description: the shared environment, built once for all uses
        made[digest] = envs.ENV_ROOT / name
    if digest in made:
        (root / name).symlink_to(made[digest], target_is_directory=True)
    else:
        say(f"remax-bench ab: building environment {name} of arm {arm.label} from {spec}")
        envs.ensure_env(name, root, spec=spec, repo=arm.tree)
        made[digest] = root / name
    freeze = subprocess.run([str(envs.env_python(name, root)), "-m", "pip", "freeze"], capture_output=True, text=True)
    return {"description": str(spec), "digest": digest, "packages": freeze.stdout.split()}


def train_run(arm: Arm, framework: str, seed: int, run: Path, inputs: Path, timeout_min: float, log: Path,
           cores: list[int] | None = None) -> subprocess.Popen:
    """One run of the arm, started: trained by the arm's own code (harness.runs.train, through its CLI)."""
    return start(arm, "train", framework, "--config", arm.config, "--seed", seed, "--out", run, "--inputs", inputs,
                  "--timeout-min", timeout_min, log=log, cores=cores)


def set_up(repo: Path, raw: dict, arms: tuple[Arm, Arm], tmp: Path, logs: Path,
            say: Callable[[str], None]) -> tuple[dict, str, str | None]:
    """Each arm's checkout, frozen config and, for a planned framework, environment; refused before anything runs
    where the arms would not train the same framework on the same inputs. Returns A's frozen config, the framework
    and the environment it runs in (None: embedded in the harness's own)."""
    (tmp / "arms").mkdir()
    for arm in arms:
        resolve_arm(arm, repo, tmp / "arms" / arm.label)
    for arm in arms:
        if arm.worktree:
            git(repo, "worktree", "add", "--detach", "--", str(arm.tree), arm.commit)
        if not (arm.tree / TRAIN_MODULE).is_file():  # type: ignore[operator]
            raise HarnessError(f"arm {arm.label} ({arm.commit[:12]}): its harness has no `remax-bench train` "
                               f"({TRAIN_MODULE}), which trains each run of an A/B: compare commits from the one that "
                               "added it on")
        arm.config = tmp / f"config-{arm.label}.json"
        cli(arm, "freeze-config", "--json", json.dumps(merge(raw, arm.override)), "--out", arm.config,
             log=logs / f"{arm.label}.log")
    frozen = {arm.label: read_json_object(arm.config, "frozen config") for arm in arms}  # type: ignore[arg-type]
    differ = [d for s in ("frameworks", *INPUT_SECTIONS) for d in differences(frozen["A"].get(s),
                                                                               frozen["B"].get(s), s)]
    if differ:
        raise HarnessError("ab: the arms would not train the same framework on the same inputs: "
                           + "; ".join(differ[:5]))
    framework = frozen["A"]["frameworks"][0]
    env = environment(get_adapter(framework), frozen["A"])
    for arm in arms:
        for name in arm.envs:
            if name != env:
                raise HarnessError(f"arm {arm.label}: --{arm.label.lower()}-env {name}: {framework} runs under this "
                                   f"config in {env or 'the harness environment (embedded)'}, not in {name}")
    made: dict[str, Path] = {}
    for arm in arms:
        if env:
            arm.built[env] = arm_environment(arm, env, tmp / "envs" / arm.label, made, say)
            # Its runs launch from the folder that really holds it, not through the link to a lent one: through
            # the link its Python's prefix is another path, and torch's JIT-built ops (DeepSpeed's), whose
            # build.ninja names that prefix, would be built again in every run, by every arm's code, old or new
            # (200 s of a 3-step OpenRLHF run on one core, measured).
            arm.env_root = (tmp / "envs" / arm.label / env).resolve().parent
    return frozen["A"], framework, env


def separate_ports(arms: tuple[Arm, Arm], raw: dict, framework: str, log: Path) -> None:
    """For runs side by side: B's runs listen on ports of their own. Each fixed port the framework's runs listen on
    (the adapter's `ports`: a reward server's, a rendezvous) that A's runs use too is moved to one free now, by B's
    own freeze-config, and kept apart from B's override (arm.ports), which the record shows."""
    a, b = arms
    ports = get_adapter(framework).ports
    if ports is None:
        return
    taken = {port for _, _, port in ports(read_json_object(a.config, "frozen config"))}  # type: ignore[arg-type]
    for key, host, port in ports(read_json_object(b.config, "frozen config")):  # type: ignore[arg-type]
        if port in taken:
            with socket.socket() as s:
                s.bind((host, 0))
                free = s.getsockname()[1]
            section, name = key.split(".", 1)
            b.ports = merge(b.ports, {section: {name: free}})
    cli(b, "freeze-config", "--json", json.dumps(merge(merge(raw, b.override), b.ports)), "--out", b.config, log=log)
