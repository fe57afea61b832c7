"""`reproducibility.determinism` mapped to each framework's own knobs (docs/reproducibility.md).

Each adapter lists the knobs its framework, its rollout engine and torch have for determinism, as they are spelled
there and where its code reads them (read in the pinned versions' sources), and says what none of them makes
deterministic. Under `strict` a plan sets every knob (command words and environment variables), records them in
plan.json's "determinism", and records what stays nondeterministic as a deviation with its cause, which the report's
fairness table shows. Under `off` nothing is added: runs are seeded, with each framework's fast paths.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

KEY = "reproducibility.determinism"


@dataclass(frozen=True)
class Knob:
    knob: str  # as the framework spells it
    does: str
    source: str  # file:line in the pinned version, where the framework reads it
    args: tuple[str, ...] = ()  # words the planned command gets
    env: dict[str, str] = field(default_factory=dict)  # variables launch.sh exports


def determinism(config: dict, knobs: Sequence[Knob], not_strict: str | None) -> tuple[list[str], dict[str, str],
                                                                                      dict, list[dict]]:
    """(command words, environment variables, plan.json's "determinism", deviations) for the config's mode."""
    mode = config["reproducibility"]["determinism"]
    chosen = list(knobs) if mode == "strict" else []
    record = {"mode": mode, "knobs": [{"knob": k.knob, "does": k.does, "source": k.source} for k in chosen],
              "not_strict": not_strict if chosen else None}
    deviations = ([{"key": KEY, "shared": "strict", "effective": f"strict, but for: {not_strict}",
                    "cause": "no knob of the framework (or of its rollout engine here) makes this deterministic"}]
                  if chosen and not_strict else [])
    return ([a for k in chosen for a in k.args], {n: v for k in chosen for n, v in k.env.items()}, record,
            deviations)
