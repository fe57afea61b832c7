"""Arguments more than one subcommand takes, and the parsing of their values."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

from harness import HarnessError
from harness.io import MAX_DOCUMENT_BYTES, parse_document
from harness.results import layout

DEFAULT_INPUTS = f"{layout.RESULTS}/{layout.INPUTS}"


def with_config(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--config", type=nonempty, required=True, help="config YAML/JSON (validated against the schema)")


def with_inputs(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--inputs", type=nonempty, default=DEFAULT_INPUTS, help="inputs directory (default: %(default)s)")


def config(args: argparse.Namespace) -> dict:
    from harness.config import load_config

    return load_config(args.config)


def json_object(text: str | None, flag: str) -> dict:
    """The JSON object a flag gives, through the one bounded loader (size, depth, NaN and Infinity, 64-bit
    integers), so that a bad value is refused naming the flag before any work."""
    if text is None:
        return {}
    if len(text) > MAX_DOCUMENT_BYTES:
        raise HarnessError(f"{flag}: longer than {MAX_DOCUMENT_BYTES} characters; not a config override")
    value = parse_document(text, flag, yaml_syntax=False)
    if not isinstance(value, dict):
        raise HarnessError(f"{flag}: a JSON object of config keys, e.g. '{{\"remax\": {{\"steps\": 40}}}}'")
    return value


MAX_SEED = 2**32 - 1  # numpy's seed takes no more (harness.inputs.policy.seed_everything); the schema's bound too
# A timeout or time budget of at most 7 days: no run here takes longer, a longer one is a typo, and a huge one (1e308
# minutes is infinite seconds) never times out. The schema's launch.timeout_min has the same bound.
MAX_MINUTES = 7 * 24 * 60


def seed_list(text: str) -> list[int]:
    try:
        return [seed(s) for s in text.split(",")]
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"seeds: comma-separated integers from 0 to {MAX_SEED}, not "
                                         f"{text[:100]!r}") from None


def at_least(minimum: int, maximum: int | None = None) -> Callable[[str], int]:
    """An argparse type: an integer of at least `minimum` (and at most `maximum`: a GPU count, a number of runs)."""
    def parse(text: str) -> int:
        # Python refuses int() of more than 4,300 digits; no count here needs 20
        if len(text.strip()) > 20:
            raise argparse.ArgumentTypeError(f"an integer of at most 20 digits, not {text[:40]!r}...")
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"an integer, not {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"at least {minimum}, not {value}")
        if maximum is not None and value > maximum:
            raise argparse.ArgumentTypeError(f"at most {maximum}, not {value}")
        return value

    return parse


def seed(text: str) -> int:
    """An argparse type: a seed, 0 to 2**32 - 1."""
    return at_least(0, MAX_SEED)(text)


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


def minutes(text: str) -> float:
    """An argparse type: a timeout or time budget in minutes, above 0 and at most MAX_MINUTES (7 days)."""
    value = positive(text)
    if value > MAX_MINUTES:
        raise argparse.ArgumentTypeError(f"at most {MAX_MINUTES} minutes (7 days), not {text!r}")
    return value


def seconds(text: str) -> float:
    """An argparse type: a finite wait of 0 or more seconds (0: look once, do not wait), at most 7 days."""
    value = _finite(text)
    if not 0 <= value <= MAX_MINUTES * 60:
        raise argparse.ArgumentTypeError(f"a number of seconds from 0 to {MAX_MINUTES * 60} (7 days), not {text!r}")
    return value


def fraction(text: str) -> float:
    """An argparse type: a number strictly between 0 and 1 (a false-alarm rate, a relative change)."""
    value = positive(text)
    if value >= 1:
        raise argparse.ArgumentTypeError(f"a number between 0 and 1, not {text!r}")
    return value


# The caps and string checks of every subcommand's options but serve-reward's (tests/test_cli.py walks the parser
# for an option without them).
MAX_PAIRS = 500  # harness.comparison.ab.MAX_PAIRS (importing it here would load pandas for every subcommand)
MAX_GPUS = 64 * 1024  # the schema's launch.gpus_per_node (64) times launch.nnodes (1024)
MAX_BASELINE_RUNS = 10_000  # nightly pipeline runs: decades of nights


def nonempty(value: str) -> str:
    """An argparse type: a value that names something (a path, a framework, a JSON object); an empty or blank one is
    refused: as a path it is the current directory, which `--out ""` would write into."""
    if not value.strip():
        raise argparse.ArgumentTypeError(f"a value, not an empty or blank string ({value!r})")
    return value


def git_ref(value: str) -> str:
    """An argparse type: a git ref, or a checkout's path; never one that git would read as an option."""
    if nonempty(value).startswith("-"):
        raise argparse.ArgumentTypeError(f"a git ref or a checkout's path, not {value!r}, which starts with '-' (git "
                                         f"would read it as an option; a path: ./{value})")
    return value


# serve-reward's ranges (harness.reward.server; #61). Each is far past real use and refuses only a typo or a value the
# server could not honour: a 1 GiB body is ~100 times a 1,024-prompt batch; 64 GiB of bodies held, more memory than a
# node gives a reward server; a connection is a thread, and 65,536 threads pass any node's limit; a reward model's
# context of 2**20 tokens, past any model's. --max-length starts at the schema's reward.max_length minimum.
MAX_BODY_BYTES, MAX_BUFFERED_BYTES = 1 << 30, 1 << 36
MAX_CONNECTIONS = MAX_PENDING = MAX_BATCH = 1 << 16
MIN_TOKENS, MAX_TOKENS = 8, 1 << 20


def http_url(value: str) -> str:
    """An argparse type: an http:// or https:// URL (urllib refuses "host:port" as an unknown scheme, which a health
    check would retry until its timeout)."""
    if not nonempty(value).lower().startswith(("http://", "https://")):
        raise argparse.ArgumentTypeError(f"a URL starting with http:// or https://, not {value!r}")
    return value
