"""The DeepSpeed-Chat ingest: the launcher's JSON lines (measured), and DeepSpeed-Chat's own printed lines (perf.py
`print_throughput_step3`, main.py's `Average reward score:` line) as a cross-check, or as estimated rows where nothing
else exists; and the eval greedy accuracy that the launcher measures before and after training.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pandas as pd

from harness import HarnessError
from harness.frameworks.dschat.plan import EVAL_LOG, NAME
from harness.frameworks.registry import LoggedRun, greedy_evaluation
from harness.io import text_lines
from harness.results import metrics

ESTIMATED = "tokens_estimated"  # extra column: True where tokens come from batch size x configured lengths

_F = r"-?(?:\d+\.\d+|inf|nan)"  # an f-string float with :.2f
_X = r"[-+]?(?:\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|inf|nan)"  # a float printed with its repr
# step3_rlhf_finetuning/perf.py print_throughput_step3 and main.py's reward line, at liziniu/ReMax 536ba49.
PRINTED = {
    "e2e": ("End-to-End =>", re.compile(
        rf"End-to-End => Latency: (?P<e2e>{_F})s, TFLOPs: {_F}, Samples/sec: (?P<samples_per_s>{_F}), "
        rf"Time/seq {_F}s, Batch Size: (?P<batch>\d+), Total Seq\. Length: (?P<seq_len>\d+)")),
    "gen": ("Generation =>", re.compile(
        rf"Generation => Latency: (?P<gen>{_F})s, Per-token Latency {_F} ms, TFLOPs: {_F}, BW: {_F} GB/sec, "
        rf"Answer Seq\. Length: (?P<answer_len>\d+)")),
    "train": ("Training   =>", re.compile(rf"Training   => Latency: (?P<train>{_F})s, TFLOPs: {_F}")),
    "reward": ("Average reward score:", re.compile(
        rf"Average reward score: (?P<reward>{_X}) Average return: {_X} Average length: (?P<length>-?\d+) "
        rf"Average kl: {_X} Average entropy: {_X} Max kl: {_X} Max return: {_X} KL ratio: {_X}")),
}
_ORDER = ("e2e", "gen", "train", "reward")
_PREFIX = re.compile(r"^(?:[\w.\-]+: )?")  # a multi-node launcher's "host: " prefix


def parse_printed(path: Path) -> list[dict]:
    """DeepSpeed-Chat's per-step printed lines -> one dict per step (in order); garbled lines raise.

    Per step main.py prints End-to-End, Generation, Training (perf.py), then the Average reward line.
    """
    steps: list[dict] = []
    for lineno, raw in text_lines(path, errors="replace"):
        line = raw.rstrip("\n")
        prefix = _PREFIX.match(line)  # matches every line (the prefix is optional)
        body = line[prefix.end() if prefix else 0:].rstrip()
        kind = next((k for k, (start, _) in PRINTED.items() if body.startswith(start)), None)
        if kind is None:
            continue
        m = PRINTED[kind][1].fullmatch(body)
        if m is None:
            raise HarnessError(f"{path}:{lineno}: garbled DeepSpeed-Chat line (not in perf.py/main.py's format): "
                               f"{line[:200]!r}")
        seen = list(steps[-1]) if steps else []
        follows = (kind == "e2e" and (not seen or len(seen) >= 3)) or seen == list(_ORDER[:_ORDER.index(kind)])
        if not follows:
            raise HarnessError(f"{path}:{lineno}: {PRINTED[kind][0]!r} line out of order (after "
                               f"{', '.join(PRINTED[k][0] for k in seen) or 'nothing'} in this step)")
        if kind == "e2e":
            steps.append({})
        steps[-1][kind] = {k: float(v) for k, v in m.groupdict().items()}
    if steps and len(steps[-1]) < 3:
        raise HarnessError(f"{path}: the last step's printed lines are incomplete (the run stopped mid-print)")
    return steps


def _printed_row(step: int, block: dict, n_gpus: int) -> dict:
    e2e, gen, train = block["e2e"], block["gen"], block["train"]
    batch, answer = e2e["batch"], gen["answer_len"]
    reward = block.get("reward", {})
    return {
        "step": step, "n_gpus": n_gpus,
        # DeepSpeed-Chat's End-to-End latency is generation + training only (main.py: "it is an approximation").
        "time_step_s": e2e["e2e"], "time_gen_s": gen["gen"], "time_transition_s": math.nan,
        "time_train_s": train["train"],
        # Estimated as DeepSpeed-Chat's own throughput assumes: every sequence at the configured maximum lengths.
        "tokens_prompt": batch * (e2e["seq_len"] - answer), "tokens_response": batch * answer,
        "tokens_baseline": batch * answer,
        "reward_mean": reward.get("reward", math.nan), "reward_baseline_mean": math.nan,
        # main.py's "Average kl" is a per-token mean, not the schema's per-response sum: not used.
        "kl_mean": math.nan,
        # main.py counts the action mask from the last prompt token on: one more than the response's tokens.
        "response_length_mean": reward["length"] - 1 if "length" in reward else math.nan,
        metrics.FRAMEWORK_THROUGHPUT: e2e["samples_per_s"] * e2e["seq_len"],
        ESTIMATED: True,
    }


def _read_json_lines(path: Path) -> list[dict]:
    rows = []
    for lineno, line in text_lines(path):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except (ValueError, RecursionError) as e:  # NaN passes here: the common schema names its step
            raise HarnessError(f"{path}:{lineno}: not a JSON step record ({getattr(e, 'msg', e)})") from None
        missing = [k for k in ("step", "time_step_s", "tokens_prompt", "tokens_response") if k not in row] \
            if isinstance(row, dict) else ["a JSON object"]
        if missing:
            raise HarnessError(f"{path}:{lineno}: step record lacks {', '.join(missing)}")
        rows.append(row)
    return rows


def _is_json_lines(path: Path) -> bool:
    first = next((line for _, line in text_lines(path, errors="replace") if line.strip()), "")
    return first.lstrip().startswith("{")


def evaluation(run_dir: Path) -> dict | None:
    """Eval greedy accuracy before and after training: the launcher's greedy evaluation of the initial and the saved
    actor (reward_client.greedy_evaluation; DeepSpeed-Chat itself evaluates sampled rewards only)."""
    return greedy_evaluation(Path(run_dir) / EVAL_LOG, NAME, "the launcher", "greedy decoding of the initial and "
                             "the saved actor by the launcher (Transformers generate)")


def ingest(run: LoggedRun) -> pd.DataFrame:
    """The launcher's JSON lines (measured) with DeepSpeed-Chat's printed figure beside them; printed lines alone
    give estimated rows (`tokens_estimated`)."""
    if not run.logs:
        raise HarnessError("no DeepSpeed-Chat logs given")
    ident = run.planned.identity()
    planned_gpus = ident.pop("n_gpus")
    gpus = run.n_gpus if run.n_gpus is not None else planned_gpus or 0
    json_logs = [p for p in run.logs if _is_json_lines(p)]
    printed = [b for p in run.logs if p not in json_logs for b in parse_printed(p)]
    if json_logs:
        rows = [r for p in json_logs for r in _read_json_lines(p)]
        for i, r in enumerate(rows):
            r[ESTIMATED] = False
            if run.n_gpus is not None:
                r["n_gpus"] = run.n_gpus
            if i < len(printed):  # DeepSpeed-Chat prints one block per step, after the step
                e2e = printed[i]["e2e"]
                r[metrics.FRAMEWORK_THROUGHPUT] = e2e["samples_per_s"] * e2e["seq_len"]
    else:
        rows = [_printed_row(i, b, gpus) for i, b in enumerate(printed, 1)]
    for r in rows:
        r.update(ident)
    df = metrics.to_frame(rows, ", ".join(map(str, run.logs)))
    flags = {int(r["step"]): bool(r[ESTIMATED]) for r in rows}
    df[ESTIMATED] = df["step"].map(flags).astype(bool)
    return df
