"""Arguments more than one subcommand takes, and the parsing of their values."""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable

from harness import HarnessError
from harness.results import layout

DEFAULT_INPUTS = f"{layout.RESULTS}/{layout.INPUTS}"


def with_config(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--config", required=True, help="config YAML/JSON (validated against the schema)")


def with_inputs(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--inputs", default=DEFAULT_INPUTS, help="inputs directory (default: %(default)s)")


def config(args: argparse.Namespace) -> dict:
    from harness.config import load_config

    return load_config(args.config)


def json_object(text: str | None, flag: str) -> dict:
    if text is None:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise HarnessError(f"{flag}: not JSON ({e.msg} at character {e.pos}): {text!r}") from None
    if not isinstance(value, dict):
        raise HarnessError(f"{flag}: a JSON object of config keys, e.g. '{{\"remax\": {{\"steps\": 40}}}}'")
    return value


def seed_list(text: str) -> list[int]:
    try:
        seeds = [int(s) for s in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"seeds: comma-separated integers, not {text!r}") from None
    if any(s < 0 for s in seeds):
        raise argparse.ArgumentTypeError(f"each at least 0, not {text!r}")
    return seeds


def at_least(minimum: int) -> Callable[[str], int]:
    """An argparse type: an integer of at least `minimum` (a seed, a GPU count, a number of runs)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"an integer, not {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"at least {minimum}, not {value}")
        return value

    return parse


def port(text: str) -> int:
    value = at_least(0)(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"a TCP port (0-65535; 0 = any free one), not {value}")
    return value


def _finite(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a number, not {text!r}") from None
    if not math.isfinite(value):  # a timeout of NaN or inf never times out
        raise argparse.ArgumentTypeError(f"a finite number, not {text!r}")
    return value


def positive(text: str) -> float:
    """An argparse type: a finite number above 0 (a timeout in minutes, a time budget)."""
    value = _finite(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"a finite number above 0, not {text!r}")
    return value


def seconds(text: str) -> float:
    """An argparse type: a finite wait of 0 or more seconds (0: look once, do not wait)."""
    value = _finite(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"a finite number of seconds, 0 or more, not {text!r}")
    return value


def fraction(text: str) -> float:
    """An argparse type: a number strictly between 0 and 1 (a false-alarm rate, a relative change)."""
    value = positive(text)
    if value >= 1:
        raise argparse.ArgumentTypeError(f"a number between 0 and 1, not {text!r}")
    return value
