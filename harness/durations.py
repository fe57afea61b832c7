"""How long a profile takes, measured and dated: the one source of every such figure the harness shows its users
(the report's reason for a framework that did not run, the README, which tests/test_code_style.py holds to it).
A figure is replaced only by a new measurement, with its date and the command that gave it."""

from __future__ import annotations

# profile -> (figure, date measured, how)
DURATIONS = {
    "cpu-frameworks": (
        "31-42 min on 2 cores", "2026-12-05",
        "`snakemake --cores all --configfile workflows/config/cpu-frameworks.yaml` from a clean clone, environments "
        "included: 31 and 34.9 min on two runs (42 min on a slower day of the same VM, before each environment kept "
        "its own DeepSpeed ops); 15 of 15 runs ok"),
}


def how_long(profile: str) -> str:
    """The figure with its date, as users read it: "31-42 min on 2 cores, measured 2026-12-05"."""
    figure, measured, _ = DURATIONS[profile]
    return f"{figure}, measured {measured}"
