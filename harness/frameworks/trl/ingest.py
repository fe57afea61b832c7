"""The TRL ingest: the trainer's step records (measured, the harness's clock around TRL's own code) in the common
schema, with TRL's own printed log line of each step (transformers' PrinterCallback: the `Trainer.log` dict) as the
cross-check; and the trainer's greedy evaluation before and after training.
"""

from __future__ import annotations

import ast
import json
import math
from pathlib import Path

import pandas as pd

from harness import HarnessError
from harness.frameworks.registry import LoggedRun, greedy_evaluation
from harness.frameworks.trl.plan import EVAL_LOG, NAME, STEPS_LOG, TRL_LOG
from harness.io import text_lines
from harness.results import metrics


def parse_printed(path: Path) -> list[dict]:
    """TRL's own per-step log lines: transformers' PrinterCallback prints each `Trainer.log` dict, floats formatted
    with :.4g (trainer_callback.py PrinterCallback.on_log, Transformers 5.24). The closing summary line (train_runtime)
    is not a step."""
    steps = []
    for lineno, line in text_lines(path, errors="replace"):
        if not line.startswith("{'loss': "):
            continue
        try:
            logged = ast.literal_eval(line.strip())
            steps.append({k: float(v) for k, v in logged.items() if k in ("num_tokens", "step_time", "reward")})
        except (ValueError, TypeError, SyntaxError, AttributeError, RecursionError, MemoryError) as e:
            raise HarnessError(f"{path}:{lineno}: garbled TRL log line ({e}): {line[:200]!r}") from None
    return steps


def ingest(run: LoggedRun) -> pd.DataFrame:
    """The trainer's step records; TRL's own tokens/s beside them (its num_tokens counted over its step_time)."""
    frames = []
    n_gpus = run.n_gpus
    ident = {k: v for k, v in run.planned.identity().items() if k != "n_gpus"}
    for path in run.logs:
        if path.name != STEPS_LOG:
            continue
        rows = []
        for lineno, line in text_lines(path):
            try:
                row = json.loads(line)
            except (ValueError, RecursionError) as e:  # NaN passes here: the common schema names its step
                raise HarnessError(f"{path}:{lineno}: not a JSON step record ({getattr(e, 'msg', e)})") from None
            if not isinstance(row, dict):
                raise HarnessError(f"{path}:{lineno}: a step record is a JSON object, not {type(row).__name__}")
            rows.append({**row, **ident, **({"n_gpus": n_gpus} if n_gpus is not None else {})})
        printed = path.with_name(TRL_LOG)
        own = parse_printed(printed) if printed.is_file() else []
        seen = 0.0
        for row, logged in zip(rows, own):
            # num_tokens is TRL's running count of prompt + completion tokens it generated (trainer state
            # num_input_tokens_seen): the greedy responses count, as both _generate calls add to it.
            row[metrics.FRAMEWORK_THROUGHPUT] = (logged["num_tokens"] - seen) / logged["step_time"] \
                if logged.get("step_time") else math.nan
            seen = logged["num_tokens"]
        frames.append(metrics.to_frame(rows, str(path)))
    if not frames:
        raise HarnessError(f"no TRL step records ({STEPS_LOG}) among {', '.join(map(str, run.logs)) or 'no logs'}")
    return pd.concat(frames, ignore_index=True)


def evaluation(run_dir: Path) -> dict | None:
    return greedy_evaluation(Path(run_dir) / EVAL_LOG, NAME, "the trainer", "greedy decoding of the initial and the "
                             "trained policy by remax_trl.py (Transformers generate)")
