"""How long a profile takes, measured and dated: the one source of every such figure the harness shows its users
(the report's reason for a framework that did not run, the README, which tests/test_code_style.py holds to it).
A figure is replaced only by a new measurement, with its date and the command that gave it."""

from __future__ import annotations

# profile -> (figure, date measured, how)
DURATIONS = {
    "cpu-frameworks": (
        "31-57 min on 2 cores", "2026-12-06",
        "`snakemake --cores all --configfile workflows/config/cpu-frameworks.yaml` from a clean clone: 31 and 34.9 "
        "min on two runs of 2026-12-05, environments included; 57 min on 2026-12-06 on a host about 1.7x slower "
        "(the reference's tokens/s 6,000-6,800 against 10,600-11,500), environments already built; 15 of 15 runs ok"),
}


def how_long(profile: str) -> str:
    """The figure with its date, as users read it: "31-57 min on 2 cores, measured 2026-12-06"."""
    figure, measured, _ = DURATIONS[profile]
    return f"{figure}, measured {measured}"
