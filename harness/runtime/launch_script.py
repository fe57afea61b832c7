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
from pathlib import Path

from jinja2 import Environment, StrictUndefined

RUN_DIR = "$RUN_DIR"
TEMPLATES = Path(__file__).with_name("templates")
# Shell text, so no escaping; `{#` starts a comment in Jinja but a length in bash ("${#ARRAY[@]}"): comments are
# `{##`. A block tag's line leaves no blank line behind it.
_JINJA = Environment(undefined=StrictUndefined, autoescape=False, keep_trailing_newline=True, trim_blocks=True,
                     lstrip_blocks=True, comment_start_string="{##", comment_end_string="##}")
REWARD_URL = "$REWARD_URL"


def shell_word(arg: str) -> str:
    """`arg` quoted for bash, with the RUN_DIR and REWARD_URL placeholders in it left to expand."""
    if arg == REWARD_URL:
        return f'"{REWARD_URL}"'
    return f'"{RUN_DIR}"'.join(shlex.quote(p) if p else "" for p in arg.split(RUN_DIR)) or "''"


def fill(template: Path, **values: object) -> str:
    """A launch fragment from its template file (a launch.sh skeleton, or a framework's lines in its own folder);
    every value is already shell text (shell_word), and a value the template names but is not given is an error."""
    return _JINJA.from_string(template.read_text()).render(**values)


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


LAUNCH_SCRIPT_ROLE = "launch script"  # what a plan's launch.sh is (harness.io.WRITTEN)
RAY_PORT = 6379  # Ray's default head port, as the SLURM scripts below use it


def ray_cluster_block(ray: list[str], nnodes: int, gpus_per_node: int, python: list[str], *, local: bool) -> str:
    """launch.sh lines (templates/ray_cluster.sh.j2) that start a Ray cluster of `nnodes` nodes and point the
    framework's driver at it (RAY_ADDRESS), as Ray's SLURM guide (slurm-basic.sh) and verl's
    examples/slurm/ray_on_slurm.slurm do: the head on the allocation's first node, a worker on each other node through
    srun, each declaring its GPUs, and the driver on the head. With `local` (a CPU run) this machine stands in for the
    nodes: each is a Ray node of its own, with one pretend GPU. Either way launch.sh waits until every node has
    joined, prints them, and stops the cluster when it exits."""
    resources = f"--num-gpus {gpus_per_node}" + (" --num-cpus 8" if local else "")
    ray_cmd = shell_words(ray)
    start = (f'{ray_cmd} start --head --node-ip-address="$RAY_HEAD_IP" --port={RAY_PORT} {resources} '
             "--include-dashboard=false --disable-usage-stats")
    join = f'{ray_cmd} start --address="$RAY_HEAD_IP:{RAY_PORT}" {resources}'
    return fill(TEMPLATES / "ray_cluster.sh.j2", nnodes=int(nnodes), ray=ray_cmd, start=start, join=join,
                local=local, port=RAY_PORT, python=shell_words(python))


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
    return fill(TEMPLATES / "launch.sh.j2", title=title, checks=checks, env_check=env_check, setup=setup,
                reward_server=reward_server or "", exports=exports, cluster=cluster or "", command=command)
