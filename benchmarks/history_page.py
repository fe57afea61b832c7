"""History page render time for 365 nights x 5 frameworks x 3 seeds (target: at most 5 s).

    python benchmarks/history_page.py [--nights 365] [--frameworks 5] [--keep DIR]

The history is SYNTHETIC (tests/synthetic_history.py: rows of the harness's own schema with the default profile's
full config in their provenance, a check record per night, a 10% drop with alerts and an accepted baseline) and is
written before the clock starts; the timed part is `harness.report.history.write_history_page`, what
`remax-bench history page` and the report call: reading and checking every row, the charts, the page. Exit 1 when
the target is missed.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from synthetic_history import write_history  # noqa: E402

from harness.report.history import write_history_page  # noqa: E402

TARGET_S = 5.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nights", type=int, default=365)
    ap.add_argument("--frameworks", type=int, default=5)
    ap.add_argument("--keep", type=Path, help="write the history and the page here (default: a temporary dir)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = args.keep or Path(tmp)
        results = root / "results"
        slow = args.nights * 2 // 3
        write_history(results, args.nights, [f"framework-{k}" for k in range(args.frameworks)], slow_from=slow,
                      alerts={slow, slow + 1, slow + 2}, accepted=slow + 10)
        started, cpu = time.perf_counter(), time.process_time()
        page = write_history_page(results, root / "page")
        took, cpu = time.perf_counter() - started, time.process_time() - cpu
        size = page.stat().st_size
    print(f"history page: {args.nights} nights x {args.frameworks} frameworks x 3 seeds in {took:.2f} s "
          f"(target {TARGET_S:.0f} s; {cpu:.2f} s of CPU time: on a machine shared with other jobs the wall time is "
          f"longer), {size / 1e6:.1f} MB")
    return 0 if took <= TARGET_S else 1


if __name__ == "__main__":
    sys.exit(main())
