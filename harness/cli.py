"""`remax-bench`: one subcommand per stage of the data flow (docs/design.md); Snakemake rules are thin calls of these.

One meaning per exit code, for every subcommand (docs/design.md, "Exit codes"): 0 done; 1 only "a regression was
found" (`check`); 2 bad input or a problem of the machine (a bad config, log or baseline, an unwritable or full disk,
a failing preflight row), with one line naming the file or key; 3 a bug in remax-bench, with its traceback. Nothing
partial is left as if complete.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from pathlib import Path

os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

from harness import HarnessError
from harness.results import layout

DEFAULT_INPUTS = f"{layout.RESULTS}/{layout.INPUTS}"


def _config(args: argparse.Namespace) -> dict:
    from harness.config import load_config

    return load_config(args.config)


def cmd_freeze_config(args: argparse.Namespace) -> None:
    from harness.config import validate_config
    from harness.io import write_json

    try:
        raw = json.loads(args.json)
    except json.JSONDecodeError as e:
        raise HarnessError(f"--json: not valid JSON ({e})") from None
    write_json(args.out, validate_config(raw, source="snakemake config"))


def cmd_inputs(args: argparse.Namespace) -> None:
    from harness import inputs

    build = {"dataset": inputs.build_dataset, "policy": inputs.build_policy, "reward": inputs.build_reward}[args.what]
    print(f"{args.what}: sha256 {build(_config(args), args.inputs)}")


def cmd_run(args: argparse.Namespace) -> None:
    from harness.frameworks import get_adapter
    from harness.io import check_replaceable

    adapter = get_adapter(args.framework)
    if adapter.run is None:
        raise HarnessError(f"framework {args.framework!r} is not embedded: use `remax-bench plan {args.framework}` "
                           "and launch it with its own environment")
    check_replaceable(args.out, layout.run_owner(args.framework, args.seed))  # before the run, not after it
    adapter.run(_config(args), args.seed, Path(args.out), Path(args.inputs))


def cmd_plan(args: argparse.Namespace) -> None:
    from harness.frameworks import get_adapter
    from harness.io import check_replaceable

    adapter = get_adapter(args.framework)
    if adapter.plan is None:
        raise HarnessError(f"framework {args.framework!r} is embedded: use `remax-bench run {args.framework}`")
    check_replaceable(args.out, layout.plan_owner(args.framework, args.seed))
    adapter.plan(_config(args), args.seed, Path(args.out), Path(args.inputs))


def cmd_launch(args: argparse.Namespace) -> None:
    from harness.frameworks.launch import launch

    launch(args.plan_dir, args.out, args.timeout_min, _config(args))


def cmd_reproduce(args: argparse.Namespace) -> None:
    from harness.regression.reproduce import RECORD, reproduce

    record = reproduce(args.run_dir, args.out, args.inputs, args.timeout_min)
    print(f"{record['run_id']}: {record['text']} ({args.out}/{RECORD})")


def _ab_limits(args: argparse.Namespace) -> dict:
    return {"framework": args.framework, "seeds": args.seeds, "max_pairs": args.max_pairs, "min_pairs": args.min_pairs,
            "max_minutes": args.max_minutes, "resolution": args.resolution, "alpha": args.alpha}


def _repo() -> Path:
    from harness.regression.ab import git

    return Path(git(Path.cwd(), "rev-parse", "--show-toplevel"))


def cmd_ab(args: argparse.Namespace) -> int:
    from harness.regression.ab import EXIT, Arm, compare
    from harness.report.ab import PAGE, write_page

    arms = [Arm(label, spec, _json_arg(override, f"--{label.lower()}-set"), envs=_env_args(given, label))
            for label, spec, override, given in (("A", args.a, args.a_set, args.a_env),
                                                 ("B", args.b, args.b_set, args.b_env))]
    record = compare(_repo(), Path(args.config), arms[0], arms[1], Path(args.out), split=args.split,
                     render=write_page, **_ab_limits(args))
    print(f"{record['verdict']['text']} ({args.out}/{PAGE})")
    return EXIT[record["verdict"]["verdict"]]


def _env_args(given: list[str] | None, label: str) -> dict[str, Path]:
    out = {}
    for text in given or []:
        name, sep, spec = text.partition("=")
        if not sep or not name or not spec:
            raise HarnessError(f"--{label.lower()}-env {text!r}: expected NAME=DESCRIPTION_FILE "
                               "(e.g. verl-cpu=envs/verl-0.9.2.txt)")
        out[name] = Path(spec)
    return out


def cmd_bisect(args: argparse.Namespace) -> None:
    from harness.regression.ab import bisect

    ab_args = [f"--{k.replace('_', '-')}={v}" for k, v in _ab_limits(args).items() if k != "seeds" and v is not None]
    ab_args += [f"--seeds={','.join(map(str, args.seeds))}"] if args.seeds else []
    bisect(_repo(), args.good, args.bad, Path(args.config), Path(args.out), ab_args)


def _json_arg(text: str | None, flag: str) -> dict:
    if text is None:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise HarnessError(f"{flag}: not JSON ({e.msg} at character {e.pos}): {text!r}") from None
    if not isinstance(value, dict):
        raise HarnessError(f"{flag}: a JSON object of config keys, e.g. '{{\"remax\": {{\"steps\": 40}}}}'")
    return value


def _seed_list(text: str) -> list[int]:
    try:
        return [int(s) for s in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"seeds: comma-separated integers, not {text!r}") from None


def cmd_ingest(args: argparse.Namespace) -> None:
    from harness.frameworks import get_adapter
    from harness.results.metrics import write_metrics

    adapter = get_adapter(args.framework)
    logs = []
    for log in map(Path, args.logs):
        found = sorted(log.glob(adapter.log_glob)) if log.is_dir() else [log]
        if not found or not all(p.is_file() for p in found):
            where = f" ({adapter.log_glob})" if log.is_dir() else ""
            raise HarnessError(f"{log}: no {adapter.name} log found{where}")
        logs += found
    df = adapter.ingest(logs, args.n_gpus)
    write_metrics(df, args.out)
    print(f"{args.out}: {len(df)} steps from {len(logs)} log(s)")


def cmd_summarize(args: argparse.Namespace) -> None:
    from harness.io import atomic_path
    from harness.results.summarize import efficiency_of, summarize

    config = _config(args)
    evals = [Path(d) / "eval.json" for d in args.runs if (Path(d) / "eval.json").is_file()]
    efficiency = efficiency_of(config, Path(args.policy), [Path(d) for d in args.runs]) if args.policy else None
    summary = summarize([Path(p) for p in args.metrics], evals, config["remax"]["warmup_steps"], efficiency)
    with atomic_path(args.out) as tmp:
        summary.to_csv(tmp, index=False)
    print(summary.to_string(index=False))


def cmd_conformance(args: argparse.Namespace) -> None:
    """Each configured framework's own advantage code on the shared vectors, in one table for the report."""
    import pandas as pd

    from harness.frameworks import conformance_env, get_adapter
    from harness.io import atomic_path
    from harness.report.tables import shared_vectors_source

    config = _config(args)
    adapters = [a for fw in config["frameworks"] if (a := get_adapter(fw)).conformance is not None]
    tables = [a.conformance(config).assign(source=shared_vectors_source(conformance_env(a, config)))  # type: ignore[misc]
              for a in adapters]
    if not tables:
        raise HarnessError(f"{args.config}: no configured framework has a conformance check")
    table = pd.concat(tables, ignore_index=True)
    with atomic_path(args.out) as tmp:
        table.to_csv(tmp, index=False)
    print(table.to_string(index=False))


def cmd_env(args: argparse.Namespace) -> None:
    from harness.io import write_text
    from harness.runtime.envs import ensure_env

    python = ensure_env(args.name)
    print(python)
    if args.out:
        write_text(args.out, f"{python}\n")


def cmd_image(args: argparse.Namespace) -> None:
    from harness.config import validate_config
    from harness.runtime.container import build_image

    if args.json:
        try:
            config = validate_config(json.loads(args.json), source="--json")
        except json.JSONDecodeError as e:
            raise HarnessError(f"--json: not valid JSON ({e})") from None
    else:
        config = _config(args)
    record = build_image(args.name, config, args.out)
    print(f"{record['sif']}: sha256 {record['sif_sha256']} (from {record['from']})")


def cmd_serve_reward(args: argparse.Namespace) -> None:
    from harness.reward import server as reward_server

    if args.health_check:
        answer = reward_server.wait_healthy(args.health_check, args.timeout)
        print(f"{args.health_check}: healthy ({answer['reward']}, sha256 {answer['sha256']})")
    else:
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
                            max_pending=args.max_pending, max_batch=args.batch_size)


def cmd_history_append(args: argparse.Namespace) -> None:
    from harness.regression.history import append

    path, rows, new = append(args.results)
    print(f"{path}: {'appended' if new else 'already in the history, nothing written:'} {len(rows)} run(s) of "
          f"pipeline run {rows[0]['pipeline_run']}")
    if args.receipt:
        from harness.io import write_json

        write_json(args.receipt, {"history_file": str(path), "pipeline_run": rows[0]["pipeline_run"],
                                  "runs": [r["run_id"] for r in rows], "newly_appended": new})


def cmd_baseline_update(args: argparse.Namespace) -> None:
    import shlex

    from harness.io import write_json
    from harness.regression.baseline import build_baseline

    profile = args.profile
    if profile is None:
        config = layout.path(args.results, layout.CONFIG)
        if not config.is_file():
            raise HarnessError(f"{config}: missing; give the profile with --profile")
        profile = json.loads(config.read_text())["profile"]
    command = "remax-bench " + shlex.join(sys.argv[1:])
    base = build_baseline(layout.path(args.results, layout.HISTORY), profile=profile, runs=args.runs, last=args.last,
                          command=command)
    write_json(args.out, base)
    print(f"{args.out}: baseline of profile {profile!r} from pipeline runs "
          + ", ".join(p["pipeline_run"] for p in base["pipeline_runs"]))


def cmd_check(args: argparse.Namespace) -> int:
    from harness.regression.alerts import render_markdown, write_alerts
    from harness.regression.check import check

    result = check(args.baseline, args.results)
    write_alerts(result, args.results)
    print(render_markdown(result))
    return 1 if result["status"] == "regression" else 0


def cmd_preflight(args: argparse.Namespace) -> int:
    from harness.config import load_config
    from harness.frameworks.preflight import preflight, render
    from harness.io import write_text

    rows = preflight(load_config(args.config), Path(args.results))
    text = render(rows)
    print(text, end="")
    if args.out:
        write_text(args.out, text)
    return 2 if any(r["status"] == "fail" for r in rows) else 0


def cmd_report(args: argparse.Namespace) -> None:
    from harness.report import render

    render(args.results_dir, args.out)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="remax-bench", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)

    def with_config(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--config", required=True, help="config YAML/JSON (validated against the schema)")

    sp = sub.add_parser("freeze-config", help="validate a config given as JSON, fill defaults, write it")
    sp.add_argument("--json", required=True)
    sp.add_argument("--out", required=True)
    sp.set_defaults(func=cmd_freeze_config)

    sp = sub.add_parser("inputs", help="build one shared input (with its .sha256)")
    sp.add_argument("what", choices=["dataset", "policy", "reward"])
    with_config(sp)
    sp.add_argument("--inputs", default=DEFAULT_INPUTS, help="inputs directory (default: %(default)s)")
    sp.set_defaults(func=cmd_inputs)

    for name, func, help_ in (("run", cmd_run, "run an embedded backend"),
                              ("plan", cmd_plan, "write a real framework's launch directory, without running it")):
        sp = sub.add_parser(name, help=help_)
        sp.add_argument("framework")
        with_config(sp)
        sp.add_argument("--seed", type=int, required=True)
        sp.add_argument("--out", required=True)
        sp.add_argument("--inputs", default=DEFAULT_INPUTS, help="inputs directory (default: %(default)s)")
        sp.set_defaults(func=func)

    sp = sub.add_parser("launch", help="run a planned framework run (PLAN_DIR/launch.sh) under a timeout")
    sp.add_argument("plan_dir")
    sp.add_argument("--out", required=True, help="run directory (appears only when the run succeeded)")
    sp.add_argument("--timeout-min", type=float, required=True)
    with_config(sp)
    sp.set_defaults(func=cmd_launch)

    sp = sub.add_parser("reproduce", help="run a finished run again from its manifest and say whether it reproduced "
                                          "(identical, or the first divergent step); exit 2 naming what differs "
                                          "when inputs, commit, packages or machine are not the recorded ones")
    sp.add_argument("run_dir")
    sp.add_argument("--out", required=True, help="the rerun's run directory (never the original)")
    sp.add_argument("--inputs", help="the inputs directory (default: where the manifest's dataset is)")
    sp.add_argument("--timeout-min", type=float, help="a planned framework's timeout (default: the config's)")
    sp.set_defaults(func=cmd_reproduce)

    def ab_options(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--config", required=True, help="the profile both arms run (YAML)")
        sp.add_argument("--framework", help="the framework both arms run (default: the config's one framework)")
        sp.add_argument("--out", required=True)
        sp.add_argument("--seeds", type=_seed_list, help="seeds, comma-separated (default: the config's)")
        sp.add_argument("--max-pairs", type=int, default=12, help="hard cap on pairs (default: %(default)s)")
        sp.add_argument("--min-pairs", type=int, default=3, help="pairs before the first look (default: %(default)s)")
        sp.add_argument("--max-minutes", type=float, default=15.0, help="hard cap on time (default: %(default)s)")
        sp.add_argument("--resolution", type=float, default=0.03,
                        help="'no difference' needs the interval within this fraction (default: %(default)s)")
        sp.add_argument("--alpha", type=float, default=0.01,
                        help="chance that A against A is called different, over all looks (default: %(default)s)")

    sp = sub.add_parser("ab", help="is B slower than A? Two commits, framework versions or configs run "
                                   "interleaved, paired; exit 0 no slower, 1 slower, 4 inconclusive, 2 bad arm")
    sp.add_argument("--a", required=True, help="arm A: a git ref, or a clean checkout's path")
    sp.add_argument("--b", required=True, help="arm B: a git ref, or a clean checkout's path")
    sp.add_argument("--a-set", help="arm A's config override, a JSON object")
    sp.add_argument("--b-set", help="arm B's config override, a JSON object")
    for arm in ("a", "b"):
        sp.add_argument(f"--{arm}-env", action="append", metavar="NAME=FILE",
                        help=f"arm {arm.upper()}'s framework environment NAME from this description (a pip "
                             "requirements file as workflows/envs/NAME.txt: another framework version); repeatable")
    sp.add_argument("--split", type=float, help="decide only whether B is slower than A by more than this fraction "
                                                "(what bisect asks of each commit)")
    ab_options(sp)
    sp.set_defaults(func=cmd_ab)

    sp = sub.add_parser("bisect", help="the first commit between GOOD and BAD that `ab` against GOOD calls slower "
                                       "(git bisect run)")
    sp.add_argument("good")
    sp.add_argument("bad")
    ab_options(sp)
    sp.set_defaults(func=cmd_bisect)

    sp = sub.add_parser("ingest", help="a framework's own logs -> common schema parquet")
    sp.add_argument("framework")
    sp.add_argument("logs", nargs="+", help="log files, or run directories")
    sp.add_argument("--out", required=True)
    sp.add_argument("--n-gpus", type=int, default=None)
    sp.set_defaults(func=cmd_ingest)

    sp = sub.add_parser("summarize", help="per-run summaries (after warm-up) -> CSV")
    with_config(sp)
    sp.add_argument("--metrics", nargs="+", required=True, help="common-schema parquet files")
    sp.add_argument("--runs", nargs="*", default=[],
                    help="run directories; the eval.json of those that have one (greedy accuracy) is joined by run_id")
    sp.add_argument("--policy", help="the shared policy checkpoint: its config.json gives the model FLOPs of the MFU "
                                     "columns (against each run directory's peak)")
    sp.add_argument("--out", required=True)
    sp.set_defaults(func=cmd_summarize)

    sp = sub.add_parser("conformance", help="frameworks' own ReMax advantage vs the reference (builds their CPU envs)")
    with_config(sp)
    sp.add_argument("--out", required=True)
    sp.set_defaults(func=cmd_conformance)

    sp = sub.add_parser("env", help="build (once) the pinned environment workflows/envs/NAME.txt; print its python")
    sp.add_argument("name")
    sp.add_argument("--out", help="also write the environment's python path to this file")
    sp.set_defaults(func=cmd_env)

    sp = sub.add_parser("image", help="pull or build (apptainer) the image of environment NAME "
                                      "(container.images.NAME) into results/images/NAME.sif, with NAME.json")
    sp.add_argument("name")
    source = sp.add_mutually_exclusive_group(required=True)
    source.add_argument("--config", help="config YAML/JSON (validated against the schema)")
    source.add_argument("--json", help="the config as JSON (the workflow passes just the container block)")
    sp.add_argument("--out", help="the .sif to write (default results/images/NAME.sif; the record goes beside it)")
    sp.set_defaults(func=cmd_image)

    sp = sub.add_parser("serve-reward", help="serve the shared reward over HTTP (OpenRLHF's remote reward protocol)")
    sp.add_argument("--host", default="127.0.0.1", help="listen address (default: loopback; the server has no auth)")
    sp.add_argument("--port", type=int, default=0, help="0 = any free port (printed at start)")
    sp.add_argument("--max-body-bytes", type=int, default=8 << 20, help="larger request bodies get a 413")
    sp.add_argument("--health-check", metavar="URL", help="instead of serving: wait until the server at URL is healthy")
    sp.add_argument("--timeout", type=float, default=60.0, help="seconds --health-check waits (default: %(default)s)")
    sp.add_argument("--inputs", help="serve the shared reward recorded in this inputs directory (its reward/; "
                                     "default: the rule)")
    sp.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto", help="where a reward model scores")
    sp.add_argument("--batch-size", type=int, default=64,
                    help="texts per score call (one reward-model forward pass) (default: %(default)s)")
    sp.add_argument("--max-length", type=int, default=1024,
                    help="tokens a reward model sees, as reward.max_length (default: %(default)s)")
    sp.add_argument("--max-pending", type=int, default=4096,
                    help="requests that may wait to be scored; more are answered 503 (default: %(default)s)")
    sp.set_defaults(func=cmd_serve_reward)

    sp = sub.add_parser("history", help="the append-only results history (RESULTS/history)")
    hsub = sp.add_subparsers(dest="action", required=True)
    hp = hsub.add_parser("append", help="add the pipeline run in RESULTS to the history (once; idempotent)")
    hp.add_argument("--results", default="results")
    hp.add_argument("--receipt", help="also write a small JSON receipt here (the pipeline rule's output)")
    hp.set_defaults(func=cmd_history_append)

    sp = sub.add_parser("baseline", help="write baselines/<profile>.json from chosen history rows")
    bsub = sp.add_subparsers(dest="action", required=True)
    bp = bsub.add_parser("update", help="a new baseline from the last N pipeline runs, or the ones named")
    bp.add_argument("--results", default="results", help="results directory holding history/ (default: %(default)s)")
    bp.add_argument("--out", required=True, help="baseline file, e.g. baselines/cpu.json")
    bp.add_argument("--profile", help="default: the profile of RESULTS/config.json")
    bp.add_argument("--runs", nargs="+", metavar="ID", help="pipeline run ids (or unique prefixes) to use")
    bp.add_argument("--last", type=int, default=5, help="else the last N pipeline runs (default: %(default)s)")
    bp.set_defaults(func=cmd_baseline_update)

    sp = sub.add_parser("check", help="regression check of the latest run: exit 0 ok, 1 regression, 2 bad input")
    sp.add_argument("--baseline", required=True, help="baselines/<profile>.json")
    sp.add_argument("--results", required=True, help="results directory (summary, runs, history)")
    sp.set_defaults(func=cmd_check)

    sp = sub.add_parser("preflight", help="before a GPU profile's jobs: GPUs, driver and environments, checkpoints, "
                                          "disk, ports, Ray; one table, a fix per row; exit 2 when a check fails")
    sp.add_argument("--config", required=True)
    sp.add_argument("--results", default="results", help="where the runs will write (for the free disk)")
    sp.add_argument("--out", help="also write the table here (markdown)")
    sp.set_defaults(func=cmd_preflight)
    sp = sub.add_parser("report", help="comparison report (index.html, throughput.md/.csv, figures, runs.csv) "
                                       "from a results directory; every planned run listed, failed ones too")
    sp.add_argument("results_dir")
    sp.add_argument("--out", required=True)
    sp.set_defaults(func=cmd_report)
    return p


EXIT_BAD_INPUT = 2
EXIT_BUG = 3


def _os_error(e: OSError) -> str:
    where = ": ".join(str(f) for f in (e.filename, e.filename2) if f is not None)
    return f"{where}: {e.strerror or e}" if where else str(e)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    fail = f"remax-bench {args.command}: error:"
    try:
        rc = args.func(args)  # `check` returns 1 when it finds a regression
    except HarnessError as e:
        print(f"{fail} {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except OSError as e:  # unwritable output, a full disk, a vanished file: the machine, never a regression
        print(f"{fail} {_os_error(e)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except Exception:
        # Anything else is a bug. Python's own exit code for it would be 1, which `check` and the nightly rule read as
        # "regression found".
        traceback.print_exc()
        print(f"remax-bench {args.command}: internal error (a bug in remax-bench; the traceback is above)",
              file=sys.stderr)
        return EXIT_BUG
    return rc or 0


if __name__ == "__main__":
    sys.exit(main())
