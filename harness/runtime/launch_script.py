"""The one way a plan's launch.sh is written, for every framework (docs/design.md, "Adapters").

Every launch.sh takes the run directory as its one argument, stops with exit 2 before it makes anything when the
framework's checks refuse (e.g. a source checkout that is not the pinned one) or its environment is missing (saying
the command that builds it), copies plan.json into the run directory (ingest reads the run's
identity there), runs the framework's own setup lines, serves the shared reward when the plan says so, exports the
plan's environment variables and runs the planned command from the run directory, so that anything the framework
writes to a relative path lands there. harness.frameworks.launch runs it with stdout and stderr in RUN_DIR/console.log.

plan.json's argv and env_vars are what the script runs, word for word, except for two placeholders that only exist
once the script runs: RUN_DIR (the run directory) and REWARD_URL (the reward server it started).

Configs are shared and run by nightly CI, so no value may ever run as a command: every value that reaches a launch.sh,
an image's build script or a Snakemake shell command goes through `shell_word` here (rules: Snakemake's `:q`, the
same quoting), and a value placed in a message is first assigned to a variable, never spliced into a double-quoted
string.
"""

from __future__ import annotations

import itertools
import shlex

RUN_DIR = "$RUN_DIR"
REWARD_URL = "$REWARD_URL"


def shell_word(arg: str) -> str:
    """`arg` quoted for bash, with the RUN_DIR and REWARD_URL placeholders in it left to expand."""
    if arg == REWARD_URL:
        return f'"{REWARD_URL}"'
    return f'"{RUN_DIR}"'.join(shlex.quote(p) if p else "" for p in arg.split(RUN_DIR)) or "''"


def shell_words(argv: list[str]) -> str:
    """argv as one line of bash words."""
    return " ".join(map(shell_word, argv))


def shell_command(argv: list[str]) -> str:
    """argv as one bash command, an option and its value per line, so that a reader can find a flag."""
    lines = [[shell_word(argv[0])]]
    for prev, arg in itertools.pairwise(argv):
        if arg.startswith("-") or not prev.startswith("-"):
            lines.append([])
        lines[-1].append(shell_word(arg))
    return " \\\n  ".join(" ".join(words) for words in lines)


RAY_PORT = 6379  # Ray's default head port, as the SLURM scripts below use it


def ray_cluster_block(ray: list[str], nnodes: int, gpus_per_node: int, python: list[str], *, local: bool) -> str:
    """launch.sh lines that start a Ray cluster of `nnodes` nodes and point the framework's driver at it
    (RAY_ADDRESS), as Ray's SLURM guide (slurm-basic.sh) and verl's examples/slurm/ray_on_slurm.slurm do: the head on
    the allocation's first node, a worker on each other node through srun, each declaring its GPUs, and the driver on
    the head. With `local` (a CPU run) this machine stands in for the nodes: each is a Ray node of its own, with one
    pretend GPU. Either way launch.sh waits until every node has joined, prints them, and stops the cluster when it
    exits."""
    resources = f"--num-gpus {gpus_per_node}" + (" --num-cpus 8" if local else "")
    ray_cmd, py = shell_words(ray), shell_words(python)
    start = (f'{ray_cmd} start --head --node-ip-address="$RAY_HEAD_IP" --port={RAY_PORT} {resources} '
             "--include-dashboard=false --disable-usage-stats")
    join = f'{ray_cmd} start --address="$RAY_HEAD_IP:{RAY_PORT}" {resources}'
    if local:
        nodes = f"""RAY_HEAD_IP=127.0.0.1
{start} >/dev/null
for _ in $(seq 2 {nnodes}); do {join} >/dev/null; done
"""
    else:
        def refuse(why: str) -> str:
            return f'{{ echo "launch.sh: launch.nnodes is {nnodes}; {why}" >&2; exit 2; }}'
        nodes = "\n".join([
            '[ -n "${SLURM_JOB_NODELIST:-}" ] || ' + refuse(f"run it in a SLURM allocation of {nnodes} nodes"),
            'mapfile -t RAY_NODES < <(scontrol show hostnames "$SLURM_JOB_NODELIST")',
            f'[ "${{#RAY_NODES[@]}}" -eq {nnodes} ] || ' + refuse("the allocation has ${#RAY_NODES[@]} nodes"),
            'RAY_HEAD_IP=$(srun --nodes=1 --ntasks=1 -w "${RAY_NODES[0]}" hostname --ip-address | awk \'{print $1}\')',
            f'srun --nodes=1 --ntasks=1 -w "${{RAY_NODES[0]}}" {start} --block &',
            "sleep 10",
            f'for node in "${{RAY_NODES[@]:1}}"; do srun --nodes=1 --ntasks=1 -w "$node" {join} --block & done',
            ""])
    return f"""# A Ray cluster of {nnodes} nodes for the framework (harness.runtime.launch_script.ray_cluster_block)
stop_ray_cluster() {{
  {ray_cmd} stop --force >/dev/null 2>&1 || true
  if declare -F stop_reward_server >/dev/null; then stop_reward_server; fi  # the EXIT trap it replaces
}}
trap stop_ray_cluster EXIT
# Ray 2.60 turns token authentication on for a head that finds ~/.ray/auth_token (which any local ray.init() writes)
# but not for a worker that joins it, which the head then refuses: one token for this run, on every node and the driver
export RAY_AUTH_MODE=token
RAY_AUTH_TOKEN=$(od -An -tx1 -N32 /dev/urandom | tr -d ' \\n')
export RAY_AUTH_TOKEN
{nodes}export RAY_ADDRESS="$RAY_HEAD_IP:{RAY_PORT}"
{py} - {nnodes} <<'PY'
import sys, time
import ray
ray.init(logging_level="ERROR")
for _ in range(120):
    alive = [n for n in ray.nodes() if n["Alive"]]
    if len(alive) >= int(sys.argv[1]):
        break
    time.sleep(1)
for n in alive:
    gpus = n["Resources"].get("GPU", 0)
    print(f"launch.sh: Ray node {{n['NodeID'][:12]}} at {{n['NodeManagerAddress']}}: {{gpus:g}} GPU")
if len(alive) < int(sys.argv[1]):
    sys.exit(f"launch.sh: {{len(alive)}} of {{sys.argv[1]}} Ray nodes joined in 120 s")
PY
"""


def launch_script(*, title: str, argv: list[str], env_vars: dict[str, str], checks: str = "", env_check: str = "",
                  setup: str = "", reward_server: str | None = None, log: str | None = None,
                  cluster: str | None = None) -> str:
    """launch.sh for a planned run.

    `title` says what runs and who planned it. `checks`, `env_check` (harness.runtime.container.env_check) and
    `setup` are bash lines: the checks refuse a launch (exit 2) before anything is made, the setup runs once RUN_DIR
    and PLAN_DIR are set. With `reward_server`
    (harness.frameworks.reward_serving.server_block) the command runs as a child, so that the server's EXIT trap
    stops the server after it; without one the command replaces the shell. `log`: a file of the run directory
    that also gets the command's output (a framework whose ingest reads a log of its own name). `cluster`
    (ray_cluster_block): lines that start the framework's Ray cluster once the plan's variables are exported (its
    nodes' processes inherit them), with an EXIT trap that stops it, so the command runs as a child then too.
    """
    exports = "".join(f"export {k}={shell_word(v)}\n" for k, v in env_vars.items())
    command = shell_command(argv)
    if log:
        command += f' 2>&1 | tee "$RUN_DIR/{log}"'
    elif not (reward_server or cluster):
        command = "exec " + command
    return f"""#!/usr/bin/env bash
# {title}
# Usage: bash launch.sh RUN_DIR (harness.frameworks.launch runs it, stdout and stderr in RUN_DIR/console.log)
set -euo pipefail
[ $# -eq 1 ] || {{ echo "usage: bash launch.sh RUN_DIR" >&2; exit 2; }}
{checks}{env_check}mkdir -p "$1"
RUN_DIR="$(cd "$1" && pwd)"
PLAN_DIR="$(cd "$(dirname "${{BASH_SOURCE[0]}}")" && pwd)"
cp "$PLAN_DIR/plan.json" "$RUN_DIR/plan.json"
{setup}{reward_server or ""}{exports}cd "$RUN_DIR"
{cluster or ""}{command}
"""
