"""Apache Otava's change points for nightly series, the way `otava analyze` finds them; runs in Otava's environment.

    .venvs/otava/bin/python benchmarks/otava_changepoints.py < series.json > changepoints.json

stdin: {"options": {...}, "series": [{"values": [...], "from": H}, ...]}; options are AnalysisOptions' fields
(window_len, max_pvalue, min_magnitude), left out: the CLI's defaults. stdout: per series, one list per prefix
values[:n] for n = from .. len(values), of [index, relative change] per change point, where index is the first
point of the new level and the change is Otava's forward_rel_change (mean after / mean before - 1). A nightly job
that runs Otava on its series each night sees exactly these prefixes.
"""

import json
import sys

from otava.series import AnalysisOptions, Metric, Series


def change_points(values: list[float], options: AnalysisOptions) -> list[list[float]]:
    series = Series(test_name="series", branch=None, time=list(range(len(values))), metrics={"m": Metric()},
                    data={"m": list(map(float, values))}, attributes={})
    return [[int(cp.index), float(cp.stats.forward_rel_change())] for cp in series.analyze(options).change_points["m"]]


def main() -> None:
    request = json.load(sys.stdin)
    options = AnalysisOptions()  # otava's CLI defaults: window_len 50, max_pvalue 0.001, min_magnitude 0
    for key, value in request.get("options", {}).items():
        if not hasattr(options, key):
            sys.exit(f"unknown Otava analysis option {key!r}")
        setattr(options, key, value)
    json.dump([[change_points(s["values"][:n], options) for n in range(s["from"], len(s["values"]) + 1)]
               for s in request["series"]], sys.stdout)


if __name__ == "__main__":
    main()
