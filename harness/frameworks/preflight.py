"""Preflight: before a GPU profile's first job, one table of everything that would stop its runs, a fix per row.

An 8-GPU job that dies after an hour of environment building because the node has 4 GPUs, the driver is older than
the wheels' CUDA, a checkpoint has a head size vLLM cannot serve or the disk fills at the first save costs the
hour and the node. Every check runs, whatever fails before it, and `remax-bench preflight` exits 1 when any row
fails. The seams to the machine are small functions (nvidia-smi's output, free disk, the process list), so the
tests replay recorded outputs there and everything else is real.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import socket
import subprocess
from collections.abc import Callable
from pathlib import Path

from harness import HarnessError
from harness.checkpoint import HEAD_FIELDS, checkpoint_config
from harness.checkpoint import head_dim as checkpoint_head_dim
from harness.frameworks import Adapter, environment, get_adapter, not_runnable
from harness.inputs import TOKENIZER_FILES
from harness.runtime.envs import ENV_ROOT, REPO, env_python, spec_path
from harness.runtime.locks import lock_of, parse_lock

GiB = 1024 ** 3
# Files of a Hugging Face checkpoint that hold weights: their size is what a framework's save of it writes.
WEIGHT_FILES = ("*.safetensors", "*.bin", "*.pt")
# Processes a Ray cluster leaves running (`ray start`, or a driver that died without `ray.shutdown()`).
RAY_PROCESSES = ("raylet", "gcs_server")
PREFLIGHT_ROLE = "preflight report"  # what render's text is, written by `preflight --out` (harness.io.WRITTEN)


def nvidia_smi(*args: str) -> str | None:
    """nvidia-smi's stdout, or None where there is no nvidia-smi (no NVIDIA driver on this machine)."""
    if shutil.which("nvidia-smi") is None:
        return None
    proc = subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=60)
    if proc.returncode:
        raise HarnessError(f"nvidia-smi {' '.join(args)}: exit {proc.returncode}: {proc.stderr.strip()[:500]}")
    return proc.stdout


def free_bytes(path: Path) -> int:
    """Free bytes on the file system that holds `path` (its nearest existing parent)."""
    path = Path(path).absolute()
    while not path.exists():
        path = path.parent
    return shutil.disk_usage(path).free


def process_commands() -> list[str]:
    """Command lines of this machine's processes (Linux /proc)."""
    commands = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                commands.append((entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
            except OSError:
                continue  # the process ended while we looked
    return commands


def _row(check: str, ok: bool, found: str, fix: str = "") -> dict:
    return {"check": check, "status": "ok" if ok else "fail", "found": found, "fix": "" if ok else fix}


def _skip(check: str, found: str) -> dict:
    return {"check": check, "status": "skip", "found": found, "fix": ""}


def _planned(config: dict) -> list[Adapter]:
    """The adapters of the frameworks this profile runs on its machines (embedded backends need no preflight)."""
    adapters = [get_adapter(fw) for fw in config["frameworks"]]
    return [a for a in adapters if a.run is None and not_runnable(a, config) is None]


def gpu_rows(config: dict, smi: Callable[..., str | None] = nvidia_smi) -> list[dict]:
    """GPU count and model against launch.*."""
    wanted, model = config["launch"]["gpus_per_node"], config["launch"]["gpu_model"]
    listing = smi("--query-gpu=name,driver_version,memory.total", "--format=csv,noheader")
    if listing is None:
        return [_row("GPUs", False, "no nvidia-smi on this machine (no NVIDIA driver)",
                     "run the preflight on a GPU node of the profile (under SLURM it runs as a job there)")]
    names = [line.split(",")[0].strip() for line in listing.strip().splitlines() if line.strip()]
    rows = [_row("GPUs", len(names) >= wanted,
                 f"{len(names)} x {', '.join(sorted(set(names))) or 'none'} (launch.gpus_per_node: {wanted})",
                 f"a node with {wanted} GPUs, or launch.gpus_per_node: {len(names)} (a different experiment)")]
    if model:
        wrong = sorted({n for n in names if model.lower() not in re.sub(r"[\s-]", "", n.lower())})
        rows.append(_row("GPU model", bool(names) and not wrong,
                         f"{', '.join(sorted(set(names))) or 'none'} (launch.gpu_model: {model})",
                         f"a node with {model} GPUs, or launch.gpu_model set to what this node has"))
    return rows


# The least compute capability vLLM's batch-invariant mode (VLLM_BATCH_INVARIANT=1, which the strict GPU plans set)
# serves, per vLLM version, read from its source: vllm/model_executor/layers/batch_invariant.py's
# enable_batch_invariant_mode installs Triton matmul overrides for the SM80 family (Ampere) and relies on cuBLAS's
# workspace settings for SM90 and SM100; it has no path below 8.0 (V100, T4), where the runs would not be batch
# invariant. 0.24.0 (verl's pin) and 0.29.0 (OpenRLHF's): both 8.0. vLLM's own page said 9.0 in older releases.
BATCH_INVARIANT_MIN_CAPABILITY = {"0.24.0": (8, 0), "0.29.0": (8, 0)}


def _pinned_vllm(env: str) -> str | None:
    """The vLLM version an environment's lock (else its description) pins; None where it has no vLLM."""
    spec = spec_path(env)
    source = lock_of(spec) or spec
    return parse_lock(source.read_text()).get("vllm", (None, []))[0] if source.is_file() else None


def strict_rows(config: dict, smi: Callable[..., str | None] = nvidia_smi) -> list[dict]:
    """Under reproducibility.determinism: strict, each planned framework whose rollouts run in vLLM against the least
    compute capability its pinned vLLM's batch-invariant mode needs."""
    if config["reproducibility"]["determinism"] != "strict":
        return []
    listing = smi("--query-gpu=name,compute_cap", "--format=csv,noheader")
    gpus = [[part.strip() for part in line.split(",")] for line in (listing or "").strip().splitlines() if line]
    rows = []
    for adapter in _planned(config):
        env = environment(adapter, config)
        version = _pinned_vllm(env) if env else None
        if version is None:
            continue  # its rollouts are not vLLM's: nothing of this kind to check
        check = f"strict: {adapter.name}'s vLLM {version} batch invariance"
        need = BATCH_INVARIANT_MIN_CAPABILITY.get(version)
        if need is None:
            rows.append(_skip(check, f"no known hardware need for vLLM {version}: see its docs, Batch Invariance"))
            continue
        if not gpus:
            rows.append(_row(check, False, "no GPU's compute capability to read (no nvidia-smi)",
                             "run the preflight on a GPU node of the profile"))
            continue
        short = sorted({f"{name} ({cap})" for name, cap in gpus
                        if tuple(int(x) for x in cap.split(".")[:2]) < need})
        rows.append(_row(check, not short, ", ".join(sorted({f"{name} ({cap})" for name, cap in gpus})) +
                         f"; needs compute capability {need[0]}.{need[1]} or higher",
                         f"GPUs of compute capability {need[0]}.{need[1]}+ (A100, H100), or "
                         "reproducibility.determinism: off (its runs then differ run to run)"))
    return rows


def driver_cuda(smi: Callable[..., str | None] = nvidia_smi) -> tuple[int, int] | None:
    """The newest CUDA the driver supports, from nvidia-smi's header ("CUDA Version: 12.2")."""
    match = re.search(r"CUDA Version:\s*(\d+)\.(\d+)", smi() or "")
    return (int(match[1]), int(match[2])) if match else None


def environment_rows(config: dict, smi: Callable[..., str | None] = nvidia_smi,
                     env_root: Path = ENV_ROOT) -> list[dict]:
    """Each planned framework's environment: built and importable, and its torch's CUDA within the driver's."""
    cuda = driver_cuda(smi)
    rows = []
    for adapter in _planned(config):
        env = environment(adapter, config)
        assert env is not None  # planned (not embedded) frameworks run in an environment of their own
        check, python = f"environment {env}", env_python(env, env_root)
        if config["container"]["runtime"] == "apptainer":
            rows.append(_skip(check, "an image (container.runtime: apptainer): checked when it is built"))
            continue
        if not python.exists():
            rows.append(_skip(check, f"not built yet ({python}): the pipeline builds it; `remax-bench env {env}` "
                                     "first, and the preflight checks it too"))
            continue
        probe = subprocess.run([str(python), "-c", f"import json, torch, {adapter.module}; print(json.dumps("
                                "{'torch': torch.__version__, 'cuda': torch.version.cuda}))"],
                               capture_output=True, text=True, timeout=600)
        if probe.returncode:
            last = (probe.stderr.strip().splitlines() or ["no output"])[-1]
            rows.append(_row(check, False, f"import {adapter.module} fails: {last}",
                             f"rebuild it: rm -rf {env_root / env} && remax-bench env {env}"))
            continue
        versions = json.loads(probe.stdout.strip().splitlines()[-1])
        built_for = tuple(int(v) for v in versions["cuda"].split(".")[:2]) if versions["cuda"] else None
        found = (f"torch {versions['torch']} (CUDA {versions['cuda'] or 'none: a CPU build'}); the driver serves "
                 f"CUDA {'.'.join(map(str, cuda)) if cuda else 'unknown'}")
        spec = spec_path(env)
        spec = spec.relative_to(REPO) if spec.is_relative_to(REPO) else spec  # an installed framework's: absolute
        fix = (f"a driver for CUDA {versions['cuda']} or newer on the node, or torch wheels of an older CUDA in "
               f"{spec} (PyTorch's cuXYZ index)" if built_for else f"a CUDA build of torch in {spec}")
        rows.append(_row(check, built_for is not None and cuda is not None and built_for <= cuda, found, fix))
    return rows


def _weights(path: Path | None) -> int:
    return sum(f.stat().st_size for pattern in WEIGHT_FILES for f in path.glob(pattern)) if path else 0


def checkpoint_rows(config: dict, policy: Path | None, reward: Path | None) -> list[dict]:
    """The policy and reward checkpoints: config, tokenizer, weights, dtype, and a head size every engine serves."""
    rows = []
    for what, key, path in (("policy", "policy.path", policy), ("reward model", "reward.path", reward)):
        if path is None:
            continue
        try:
            conf = checkpoint_config(path, f"{what} config", optional=HEAD_FIELDS)
        except (OSError, HarnessError) as e:
            rows.append(_row(f"{what} checkpoint", False, str(e),
                             f"set {key} to a Hugging Face checkpoint directory (config.json, weights, tokenizer)"))
            continue
        tokenizer = next((f for f in TOKENIZER_FILES if (path / f).is_file()), None)
        weights = _weights(path)
        dtype = conf.get("torch_dtype") or conf.get("dtype") or "unspecified"
        found = (f"{path}: {conf.get('model_type', '?')}, {weights / GiB:.2f} GiB of weights ({dtype}), "
                 f"tokenizer {tokenizer or 'missing'}")
        problems = ([] if tokenizer else [f"no tokenizer file ({', '.join(TOKENIZER_FILES)})"]) + (
            [] if weights else ["no weight files"])
        if what == "policy":
            head_dim = checkpoint_head_dim(conf)
            found += f", head_dim {head_dim}"
            problems += [f"{a.name}'s generation engine does not serve head_dim {head_dim} (it serves multiples "
                         f"of 8 up to {max(a.head_dims)})"
                         for a in _planned(config) if a.head_dims and head_dim not in a.head_dims]
        rows.append(_row(f"{what} checkpoint", not problems, "; ".join([found, *problems]),
                         f"a checkpoint at {key} that every planned framework can load: its tokenizer saved beside "
                         "the weights (save_pretrained), attention heads its engines serve"))
    return rows


def disk_rows(config: dict, policy: Path | None, results: Path,
              free: Callable[[Path], int] = free_bytes) -> list[dict]:
    """Room for the full-model checkpoints the frameworks write at the end of each run."""
    weights = _weights(policy)
    savers = [a.name for a in _planned(config) if a.saves_checkpoint]
    need, have = weights * len(savers) * len(config["seeds"]), free(results)
    found = (f"{have / GiB:.1f} GiB free at {results}; {need / GiB:.1f} GiB needed ({len(config['seeds'])} seeds "
             f"x {', '.join(savers) or 'no framework'} saving a {weights / GiB:.2f} GiB model)")
    return [_row("disk", have >= need, found,
                 "free space on that file system, or run the pipeline from a larger one (snakemake --directory)")]


def port_rows(config: dict) -> list[dict]:
    """The ports the planned runs listen on (each adapter's `ports`: a reward server's, a rendezvous)."""
    rows = []
    for key, host, port in [p for a in _planned(config) if a.ports for p in a.ports(config)]:
        with socket.socket() as s:
            try:
                s.bind((host, port))
                ok, found = True, f"{host}:{port} free"
            except OSError as e:
                code = errno.errorcode.get(e.errno, str(e.errno)) if e.errno is not None else str(e)
                ok, found = False, f"{host}:{port} in use ({code})"
        rows.append(_row(f"port {key}", ok, found, f"stop what listens there (ss -ltnp | grep :{port}), or set {key}"))
    return rows


def ray_rows(commands: Callable[[], list[str]] = process_commands) -> list[dict]:
    """A Ray cluster left running: verl and OpenRLHF would join it, with its resources and stale workers."""
    stray = [c for c in commands() if c and Path(c.split(" ", 1)[0]).name in RAY_PROCESSES]
    return [_row("no stray Ray cluster", not stray,
                 f"{len(stray)} Ray process(es), e.g. {stray[0][:100]}" if stray else "no raylet or gcs_server",
                 "ray stop --force (with an environment's ray), or end the job that started it")]


SLURM_CLIENTS = ("sbatch", "squeue", "sinfo", "scontrol")


def slurm_rows(partition: str | None) -> list[dict]:
    """Before the SLURM profile submits its first job: SLURM's commands, the controller and munge behind it, the
    partition the jobs ask for. Without these every job would fail at its sbatch, each with its own wall of text."""
    missing = [c for c in SLURM_CLIENTS if shutil.which(c) is None]
    rows = [_row("SLURM commands", not missing, f"not on PATH: {', '.join(missing)}" if missing else "all on PATH",
                 "run from a node of the cluster (its login node), or install SLURM's client (Debian: slurm-client)")]
    if missing:
        return rows + [_skip("SLURM controller", "no scontrol"), _skip("SLURM partition", "no sinfo")]

    def ask(*argv: str) -> tuple[bool, str]:
        try:
            proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=60)
        except subprocess.TimeoutExpired:
            return False, f"{argv[0]} did not answer in 60 s"
        text = (proc.stdout + proc.stderr).strip()
        return proc.returncode == 0, text

    ok, said = ask("scontrol", "ping")
    lines = said.splitlines()
    munge = [line for line in lines if "munge" in line.lower()]
    if munge:  # every request is signed by munge: without munged no command reaches the controller
        said = next((line for line in munge if "failed" in line.lower()), munge[0])  # not the "restart with" hint
        rows.append(_row("munge", False, said.split("error: ", 1)[-1],
                         "start munged on this node (systemctl start munge; the cluster's key in /etc/munge)"))
    rows.append(_row("SLURM controller", ok, lines[0] if lines else "scontrol ping said nothing",
                     "start slurmctld, or point this node at the cluster's (SlurmctldHost in slurm.conf)"))
    if not ok:
        return rows + [_skip("SLURM partition", "no controller to ask")]
    ok, said = ask("sinfo", "-h", "-o", "%P")
    known = said.split() if ok else []
    default = next((p.rstrip("*") for p in known if p.endswith("*")), None)
    names = [p.rstrip("*") for p in known]
    if partition is None:
        ok = default is not None
        found = (f"none given; the cluster's default is {default}" if ok else
                 f"none given and the cluster has no default (partitions: {', '.join(names) or 'none'})")
    else:
        ok = partition in names
        found = f"{partition} ({'known' if ok else 'unknown here'}; the cluster has: {', '.join(names) or 'none'})"
    return rows + [_row("SLURM partition", ok, found, "set slurm_partition in workflows/profiles/slurm/config.yaml "
                        "(or --default-resources slurm_partition=NAME)")]


def checkpoint_paths(config: dict) -> tuple[Path | None, Path | None]:
    """The policy and reward checkpoints the config names (None: the pipeline builds it, nothing to check yet)."""
    policy = Path(os.path.expanduser(config["policy"]["path"])) if config["policy"]["path"] else None
    reward = config["reward"]["path"] if config["reward"]["kind"] == "model" else None
    return policy, Path(os.path.expanduser(reward)) if reward else None


def preflight(config: dict, results: Path, *, smi: Callable[..., str | None] = nvidia_smi,
              free: Callable[[Path], int] = free_bytes, commands: Callable[[], list[str]] = process_commands,
              env_root: Path = ENV_ROOT) -> list[dict]:
    """Every check's row; none stops the others."""
    policy, reward = checkpoint_paths(config)
    return [*gpu_rows(config, smi), *strict_rows(config, smi), *environment_rows(config, smi, env_root),
            *checkpoint_rows(config, policy, reward),
            *disk_rows(config, policy, results, free), *port_rows(config), *ray_rows(commands)]


def render(rows: list[dict]) -> str:
    """The table, under one line that names every failed check."""
    failed = [r["check"] for r in rows if r["status"] == "fail"]
    lines = [f"preflight failed: {', '.join(failed)}" if failed else "preflight passed", "",
             "| check | status | found | fix |", "|---|---|---|---|"]
    lines += [f"| {r['check']} | {r['status']} | {r['found'].replace('|', '/')} | {r['fix']} |" for r in rows]
    return "\n".join(lines) + "\n"
