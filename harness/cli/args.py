"""Arguments more than one subcommand takes, and the parsing of their values."""

from __future__ import annotations

import argparse
import json

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
        return [int(s) for s in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"seeds: comma-separated integers, not {text!r}") from None
