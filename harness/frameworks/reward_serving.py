"""How a planned framework run is scored by the one shared reward: the plan's record of it, the plan-time checks
of a reward-model checkpoint, and the launch.sh lines that serve it.

With `reward.kind: model` every real framework gets its reward over HTTP from one `remax-bench serve-reward
--inputs DIR` process that its launch.sh starts (harness.reward.server, OpenRLHF's remote-reward protocol): the
same code, the same checkpoint, the same rendering of prompt + response and the same forward pass score all of
them, whatever each framework would do natively (verl.py and dschat.py say why their native paths are not used).
plan.json's "reward" records which checkpoint (path and sha256) and how it scored: "served" (the shared server)
or "in-process" (harness.reward.score called inside the framework's process: the rule only).
"""

from __future__ import annotations

import sys
from pathlib import Path

from harness.runtime.launch_script import fill, shell_word, shell_words

SCORED_BY = ("served", "in-process")
URL_VAR = "REMAX_BENCH_REWARD_URL"  # the served reward's URL, exported by launch.sh to the framework's processes
HEALTH_TIMEOUT_S = 600  # a 7B reward model loads in minutes, not seconds
TEMPLATE = Path(__file__).with_name("templates") / "reward_server.sh.j2"


def check_model(reward_input: dict) -> None:
    """HarnessError before any run unless the reward input is a one-label sequence-classification checkpoint (its
    sha256 was checked against the recorded one by harness.inputs.resolve_reward)."""
    from harness.reward.model import check_checkpoint

    check_checkpoint(Path(reward_input["path"]))


def plan_record(reward_input: dict, scored_by: str) -> dict:
    """plan.json's "reward": {kind, checkpoint (absolute path, or null for the rule), sha256, scored_by}; a reward
    model is checked first (check_model)."""
    if scored_by not in SCORED_BY:
        raise ValueError(f"scored_by {scored_by!r} is not one of {SCORED_BY}")
    model = reward_input["kind"] == "model"
    if model:
        check_model(reward_input)
    return {"kind": reward_input["kind"], "checkpoint": str(Path(reward_input["path"]).absolute()) if model else None,
            "sha256": reward_input["sha256"], "scored_by": scored_by}


def server_block(config: dict, inputs_dir: str | Path, record: dict, *, host: str, port: int | None,
                 health_timeout_s: float = HEALTH_TIMEOUT_S) -> str:
    """launch.sh lines (after RUN_DIR is set) that start the shared reward server on `port` (None: a free port
    picked at launch), wait until it answers, check that it is the server just started and that it serves the
    planned reward (sha256 of its /health), export REWARD_URL and $URL_VAR, and stop it when launch.sh exits.
    A server already answering on the port (another run's) stops the launch: the run would be scored by it."""
    python = shell_word(sys.executable)  # the harness's environment, not the framework's
    log = "$RUN_DIR/reward_server.log"
    serve = ["-m", "harness.cli", "serve-reward", "--host", host]
    if record["kind"] == "model":
        rc = config["reward"]
        serve += ["--inputs", str(Path(inputs_dir).resolve()), "--device", rc["device"],
                  "--batch-size", str(rc["batch_size"]), "--max-length", str(rc["max_length"])]
    pick = ("$(" + python + " -c 'import socket; s = socket.socket(); s.bind((\"127.0.0.1\", 0)); "
            "print(s.getsockname()[1])')")
    return fill(TEMPLATE, kind=record["kind"], sha256=record["sha256"], planned_sha256=shell_word(record["sha256"]),
                port=pick if port is None else int(port), host=shell_word(host), python=python,
                serve=shell_words(serve), log=log, health_timeout_s=f"{health_timeout_s:g}", url_var=URL_VAR)
