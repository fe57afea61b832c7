"""Subcommands for what the runs stand on: pinned environments, container images, the shared reward's server and the
preflight of a GPU profile."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from harness import HarnessError
from harness.cli import args as cli_args  # serve-reward's ranges
from harness.cli.args import at_least, config, nonempty, port, seconds


def cmd_env(args: argparse.Namespace) -> None:
    from harness.frameworks import env_spec
    from harness.io import check_replaceable, write_text
    from harness.runtime.envs import PYTHON_ROLE, ensure_env

    if args.name == "lock":
        cmd_env_lock(args)
        return
    if args.target:
        raise HarnessError(f"env {args.name} {args.target}: one environment at a time (or `env lock NAME`)")
    if args.out:
        check_replaceable(args.out, role=PYTHON_ROLE)  # before the build, which takes minutes
    python = ensure_env(args.name, spec=env_spec(args.name))  # an installed framework's envs/ too
    print(python)
    if args.out:
        write_text(args.out, f"{python}\n", role=PYTHON_ROLE)


def cmd_env_lock(args: argparse.Namespace) -> None:
    """`env lock NAME`: resolve NAME's description again (uv, for Linux x86_64 and Python 3.11) into its lock and
    print what changed; HarnessError (exit 2, one line) where uv is missing or cannot resolve it."""
    from harness.frameworks import env_spec
    from harness.runtime import locks

    if not args.target:
        raise HarnessError("env lock: name the environment to lock (remax-bench env lock NAME)")
    path, changed = locks.relock(env_spec(args.target))
    print(f"{path}: {len(locks.parse_lock(path.read_text()))} packages; "
          + (f"{len(changed)} changed:" if changed else "nothing changed"))
    for line in changed:
        print(f"  {line}")


def _env(sub: argparse._SubParsersAction) -> None:
    sp = sub.add_parser("env", help="build (once) the pinned environment NAME (harness/frameworks/*/envs/NAME.txt, or "
                                      "an installed framework's envs/NAME.txt; from its full lock NAME.lock where "
                                      "it has one, hashes required); print its python. `env lock NAME`: make "
                                      "NAME.lock again from NAME.txt (uv) and print what changed")
    sp.add_argument("name", type=nonempty, help="the environment, or `lock`")
    sp.add_argument("target", type=nonempty, nargs="?", help="after `lock`: the environment whose lock to make")
    sp.add_argument("--out", type=nonempty, help="also write the environment's python path to this file")
    sp.set_defaults(func=cmd_env)


def cmd_image(args: argparse.Namespace) -> None:
    from harness.config import validate_config
    from harness.io import parse_document
    from harness.runtime.container import build_image

    if args.json:
        cfg = validate_config(parse_document(args.json, "--json", yaml_syntax=False), source="--json")
    else:
        cfg = config(args)
    record = build_image(args.name, cfg, args.out)
    print(f"{record['sif']}: sha256 {record['sif_sha256']} (from {record['from']})")


def _image(sub: argparse._SubParsersAction) -> None:
    sp = sub.add_parser("image", help="pull or build (apptainer) the image of environment NAME "
                                      "(container.images.NAME) into results/images/NAME.sif, with NAME.json")
    sp.add_argument("name", type=nonempty)
    source = sp.add_mutually_exclusive_group(required=True)
    source.add_argument("--config", type=nonempty, help="config YAML/JSON (validated against the schema)")
    source.add_argument("--json", type=nonempty,
                        help="the config as JSON (the workflow passes just the container block)")
    sp.add_argument("--out", type=nonempty,
                    help="the .sif to write (default results/images/NAME.sif; the record goes beside it)")
    sp.set_defaults(func=cmd_image)


def cmd_serve_reward(args: argparse.Namespace) -> None:
    from harness.reward import server as reward_server

    if args.health_check is not None:
        answer = reward_server.wait_healthy(args.health_check, args.timeout)
        print(f"{args.health_check}: healthy ({answer['reward']}, sha256 {answer['sha256']})")
        return
    # Before a reward model loads, which takes minutes.
    reward_server.check_limits(args.max_body_bytes, args.max_buffered_bytes, args.max_connections)
    # Before torch loads OpenMP: its threads would otherwise spin while waiting for work, taking the cores the
    # server's request threads need (on a busy 2-core machine, 64 clients got 13 instead of ~500 requests/s).
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    from harness.reward.shared import load_shared_reward

    reward_input = {"kind": "rule"}
    if args.inputs:  # imports torch: the rule server starts without it
        from harness.inputs import resolve_reward

        # Only the reward is checked (resolve_inputs would also hash the policy, which a server does not use);
        # it is loaded before the server listens, so a bad input fails before any client connects.
        reward_input = resolve_reward(Path(args.inputs))
    shared = load_shared_reward(reward_input, device=args.device, batch_size=args.batch_size,
                                max_length=args.max_length)
    reward_server.serve(args.host, args.port, shared, max_body=args.max_body_bytes,
                        max_pending=args.max_pending, max_batch=args.batch_size,
                        max_buffered_bytes=args.max_buffered_bytes, max_connections=args.max_connections)


def _serve_reward(sub: argparse._SubParsersAction) -> None:
    sp = sub.add_parser("serve-reward", help="serve the shared reward over HTTP (OpenRLHF's remote reward protocol)")
    # An empty --host would listen on every interface; every number has its range (harness.cli.args).
    sp.add_argument("--host", type=nonempty, default="127.0.0.1",
                    help="listen address, not empty (default: loopback; the server has no auth)")
    sp.add_argument("--port", type=port, default=0, help="0-65535; 0 = any free port (printed at start)")
    sp.add_argument("--max-body-bytes", type=at_least(1, cli_args.MAX_BODY_BYTES), default=8 << 20,
                    help=f"1-{cli_args.MAX_BODY_BYTES}: larger request bodies get a 413 (default: %(default)s)")
    sp.add_argument("--max-buffered-bytes", type=at_least(1, cli_args.MAX_BUFFERED_BYTES), default=256 << 20,
                    help=f"request-body bytes held at once across all connections, at least --max-body-bytes and "
                         f"at most {cli_args.MAX_BUFFERED_BYTES}; past it a request gets a 503 (default: %(default)s)")
    sp.add_argument("--max-connections", type=at_least(1, cli_args.MAX_CONNECTIONS), default=8192,
                    help=f"1-{cli_args.MAX_CONNECTIONS} open connections, a thread each; one more gets a 503 at once "
                         "(default: %(default)s)")
    sp.add_argument("--health-check", type=cli_args.http_url, metavar="URL",
                    help="instead of serving: wait until the server at URL (http:// or https://) is healthy")
    sp.add_argument("--timeout", type=seconds, default=60.0,
                    help="0-604800 seconds --health-check waits (default: %(default)s)")
    sp.add_argument("--inputs", type=nonempty, help="serve the shared reward recorded in this inputs directory (its "
                                                    "reward/; default: the rule)")
    sp.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto", help="where a reward model scores")
    sp.add_argument("--batch-size", type=at_least(1, cli_args.MAX_BATCH), default=64,
                    help=f"1-{cli_args.MAX_BATCH} texts per score call (one reward-model forward pass) "
                         "(default: %(default)s)")
    sp.add_argument("--max-length", type=at_least(cli_args.MIN_TOKENS, cli_args.MAX_TOKENS), default=1024,
                    help=f"{cli_args.MIN_TOKENS}-{cli_args.MAX_TOKENS} tokens a reward model sees, as "
                         "reward.max_length (default: %(default)s)")
    sp.add_argument("--max-pending", type=at_least(1, cli_args.MAX_PENDING), default=4096,
                    help=f"1-{cli_args.MAX_PENDING} requests that may wait to be scored; more are answered 503 "
                         "(default: %(default)s)")
    sp.set_defaults(func=cmd_serve_reward)


def cmd_preflight(args: argparse.Namespace) -> int:
    from harness.frameworks.preflight import PREFLIGHT_ROLE, preflight, render
    from harness.io import check_replaceable, write_text

    if args.out:
        check_replaceable(args.out, role=PREFLIGHT_ROLE)  # before the checks, which take a while on a node
    rows = preflight(config(args), Path(args.results))
    text = render(rows)
    print(text, end="")
    if args.out:
        write_text(args.out, text, role=PREFLIGHT_ROLE)
    return 2 if any(r["status"] == "fail" for r in rows) else 0


def _preflight(sub: argparse._SubParsersAction) -> None:
    sp = sub.add_parser("preflight", help="before a GPU profile's jobs: GPUs, driver and environments, checkpoints, "
                                          "disk, ports, Ray; one table, a fix per row; exit 2 when a check fails")
    sp.add_argument("--config", type=nonempty, required=True)
    sp.add_argument("--results", type=nonempty, default="results", help="where the runs will write (for the free disk)")
    sp.add_argument("--out", type=nonempty, help="also write the table here (markdown)")
    sp.set_defaults(func=cmd_preflight)


COMMANDS = (_env, _image, _serve_reward, _preflight)
