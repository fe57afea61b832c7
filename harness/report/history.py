"""The history page, history.html: every night of the nightly series, per framework and metric, as one static page
(`remax-bench history page`, and beside the report's index.html when the results directory has a history).

Per framework, one chart per metric (tokens/s, step time per phase, reward gain, eval accuracy): each night a point
at the median over its seeds with a bar over their range, the band of the baseline the check uses (its runs' medians,
lowest to highest, where there is a baseline), the nights the check alerted on (red) or advised on (orange), the
nights a new baseline was accepted (a dashed line), and the A/B and bisect verdicts that ran on a night's commit
(a linked diamond). Each point's hover text (SVG <title>) names the night, its pipeline run, the harness commit, the
environment's digest and the figures. The check's verdict of each night is what `check` keeps in
history/checks/<pipeline run>.json (harness.regression.alerts.write_alerts).

The geometry is computed here, the markup is templates/history.html.j2's: every value reaches the template as data
and is escaped there, as on the report page (harness/report/page.py). Inline SVG, no script: the file stands alone.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import statistics
from collections.abc import Callable
from pathlib import Path

import numpy as np

from harness import HarnessError
from harness.io import read_json_object
from harness.regression.history import read_history
from harness.regression.statistics import ADJUSTED, PROBE
from harness.report.page import environment
from harness.report.tables import fmt
from harness.results import layout

PAGE_ROLE = "history page"  # what write_history_page writes (harness.io.WRITTEN)
# (title, history metric, digits, the check's metrics whose verdicts are marked on this chart)
CHARTS = (
    ("tokens/s", "throughput_tok_s", 0, (ADJUSTED, "throughput_tok_s", "throughput_tok_cpu_s", PROBE)),
    ("step time: generation (s, median)", "time_gen_s_median", 4, ()),
    ("step time: transition (s, median)", "time_transition_s_median", 5, ("time_transition_s_median",)),
    ("step time: training (s, median)", "time_train_s_median", 4, ()),
    ("reward gain (last 10% of steps minus first 10%)", "reward_gain", 3, ("reward_last10", "time_to_reward_s")),
    ("eval accuracy after training", "eval_accuracy_after", 3, ()),
)
WIDTH, HEIGHT = 1100, 150  # the SVG's box; the plot inside it:
LEFT, RIGHT, TOP, BOTTOM = 72, 12, 14, 24


def env_digest(row: dict) -> str:
    """A short digest of the packages a night ran with (its manifest's versions): equal digests, equal packages."""
    versions = json.dumps(row["provenance"].get("versions") or {}, sort_keys=True)
    return hashlib.sha256(versions.encode()).hexdigest()[:12]


def read_checks(history_dir: Path, problems: list[str]) -> dict[str, dict]:
    """pipeline run -> the check's record of that night (history/checks/*.json); an unreadable one is a problem."""
    out = {}
    for path in sorted((history_dir / "checks").glob("[!.]*.json")):  # not io's hidden record of files written
        try:
            record = read_json_object(path, "check record")
            out[str(record["pipeline_run"])] = record
        except (HarnessError, KeyError) as e:
            problems.append(f"{path}: {e}")
    return out


def read_comparisons(results: Path, out_dir: Path, problems: list[str]) -> list[dict]:
    """The A/B and bisect verdicts in RESULTS/ab and RESULTS/bisect (and one folder below each): framework, the
    commit they judged (A/B: arm B's; bisect: the first slow one, and its bad end), their verdict and a link."""
    found = []
    for kind, name in (("A/B", "ab.json"), ("bisect", "bisect.json")):
        top = layout.path(results, layout.AB if kind == "A/B" else layout.BISECT)
        for path in sorted([top / name, *top.glob(f"*/{name}")]):
            if not path.is_file():
                continue
            try:
                rec = read_json_object(path, f"{kind} record")
                if kind == "A/B":
                    commits = [rec["arms"]["B"]["commit"]]
                    verdict, framework = rec["verdict"]["text"], rec.get("framework")
                else:
                    commits = [rec["first_slow"], rec["bad"]]
                    verdict, framework = f"first slow commit {rec['first_slow'][:12]}: {rec['verdict']}", None
            except (HarnessError, KeyError, TypeError) as e:
                problems.append(f"{path}: not a {kind} record ({e})")
                continue
            page = path.parent / "index.md"
            target = page if page.is_file() else path
            found.append(dict(kind=kind, framework=framework, commits=[str(c) for c in commits], verdict=verdict,
                              href=Path(os.path.relpath(target.resolve(), out_dir.resolve())).as_posix(),
                              where=str(path.parent)))
    return found


def _baseline_bands(baseline: dict | None, fw: str) -> dict[str, tuple[float, float, float]]:
    """metric -> (lowest, median, highest) of the baseline's runs' medians over seeds, for one framework."""
    entry = (baseline or {}).get("frameworks", {}).get(fw)
    if not entry:
        return {}
    bands = {}
    for _, name, _, _ in CHARTS:
        per_run: dict[str, list[float]] = {}
        for r in entry["runs"]:
            if (v := r["metrics"].get(name)) is not None:
                per_run.setdefault(r["pipeline_run"], []).append(v)
        medians = [float(np.median(v)) for v in per_run.values()]
        if medians:
            bands[name] = (min(medians), float(np.median(medians)), max(medians))
    return bands


def _nights(rows: list[dict]) -> list[dict]:
    """One framework's rows as nights, oldest first: each pipeline run's rows with its time, commit and digest."""
    by_run: dict[str, list[dict]] = {}
    for r in rows:
        by_run.setdefault(r["pipeline_run"], []).append(r)
    nights = []
    for run, rs in by_run.items():
        first = rs[0]
        nights.append(dict(run=run, time=first["pipeline_time"], rows=rs,
                           when=dt.datetime.fromisoformat(first["pipeline_time"]).timestamp(),
                           commit=str(first["provenance"].get("git", {}).get("commit") or "n/a"),
                           env=env_digest(first), version=first["framework_version"]))
    return nights


def _marks(nights: list[dict], checks: dict[str, dict], fw: str) -> dict[str, dict]:
    """pipeline run -> this framework's verdicts that night: regressions by check metric, whether a new baseline was
    first used that night (its runs differ from the previous checked night's)."""
    out: dict[str, dict] = {}
    previous = None
    for n in nights:
        rec = checks.get(n["run"])
        if rec is None:
            continue
        found = [c for c in rec.get("checks", []) if c.get("framework") == fw and c.get("status") == "regression"]
        runs = tuple(rec.get("baseline_runs") or ())
        out[n["run"]] = dict(regressions=found, accepted=previous is not None and runs != previous,
                             status=rec.get("status", "n/a"), baseline_runs=runs)
        previous = runs
    return out


def _scale(lo: float, hi: float, a: float, b: float) -> Callable[[float], float]:
    span = hi - lo or abs(hi) or 1.0
    return lambda v: a + (v - lo) / span * (b - a)


def _chart(title: str, name: str, digits: int, watched: tuple, nights: list[dict], marks: dict[str, dict],
           band: tuple[float, float, float] | None, comparisons: list[dict]) -> dict | None:
    """One chart's geometry and hover texts; None where no night has the metric."""
    points = []
    for n in nights:
        values = [v for r in n["rows"] if (v := r["metrics"].get(name)) is not None]
        if values:
            points.append((n, statistics.median(values), min(values), max(values), len(values)))
    if not points:
        return None
    lows = [p[2] for p in points] + ([band[0]] if band else [])
    highs = [p[3] for p in points] + ([band[2]] if band else [])
    lo, hi = min(lows), max(highs)
    pad = (hi - lo) * 0.08 or abs(hi) * 0.05 or 1.0
    y = _scale(lo - pad, hi + pad, HEIGHT - BOTTOM, TOP)
    t0, t1 = nights[0]["when"], nights[-1]["when"]
    x = _scale(t0, t1 if t1 > t0 else t0 + 1, LEFT + 6, WIDTH - RIGHT - 6)
    out = []
    for n, med, mn, mx, seeds in points:
        mark = marks.get(n["run"], {})
        hits = [c for c in mark.get("regressions", []) if c.get("metric") in watched]
        cls = ("alert" if any(c.get("class") == "alert" for c in hits) else "advisory" if hits else "")
        said = "; ".join(f"{c.get('class')} {c.get('label', c.get('metric'))}: {_change(c)}" for c in hits)
        out.append(dict(x=round(x(n["when"]), 1), y=round(y(med), 1), y_lo=round(y(mn), 1), y_hi=round(y(mx), 1),
                        cls=cls, title=f"{n['time']} · pipeline run {n['run']} · commit {n['commit'][:12]} · "
                        f"environment {n['env']} · version {n['version']} · {fmt(med, digits)} (median over "
                        f"{seeds} seed(s); {fmt(mn, digits)}–{fmt(mx, digits)})" + (f" · {said}" if said else "")))
    accepted = [dict(x=round(x(n["when"]), 1), title=f"{n['time']}: a new baseline was first used this night "
                     f"(runs {', '.join(r[:8] for r in marks[n['run']]['baseline_runs'])})")
                for n in nights if marks.get(n["run"], {}).get("accepted")]
    verdicts = [dict(x=round(x(n["when"]), 1), href=c["href"], title=f"{c['kind']} on commit {n['commit'][:12]}: "
                     f"{c['verdict']}") for c in comparisons for n in nights if n["commit"] in c["commits"]]
    ticks = [dict(y=round(y(v), 1), label=fmt(v, digits)) for v in np.linspace(lo, hi, 3)]
    when = [t0 + (t1 - t0) * k / 4 for k in range(5)] if t1 > t0 else [t0]
    xticks = [dict(x=round(x(t), 1), label=dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%d"),
                   anchor="start" if k == 0 else "end" if k == len(when) - 1 else "middle")
              for k, t in enumerate(when)]
    return dict(title=title, metric=name, points=out, accepted=accepted, verdicts=verdicts, yticks=ticks,
                xticks=xticks, band=None if band is None else dict(
                    y_top=round(y(band[2]), 1), y_mid=round(y(band[1]), 1), height=round(y(band[0]) - y(band[2]), 1),
                    title=f"baseline: runs' medians {fmt(band[0], digits)}–{fmt(band[2], digits)}, median "
                          f"{fmt(band[1], digits)}"),
                alerts=sum(p["cls"] == "alert" for p in out))


def _change(c: dict) -> str:
    change = c.get("change")
    if change is None:
        return c.get("status", "")
    unit = "%" if c.get("unit") == "%" else ""
    return f"{change:+.1f}{unit}" if unit else f"{change:+.3f}"


def history_view(results: Path, out_dir: Path, baseline_path: Path | None = None) -> dict:
    """What the page shows, from RESULTS/history (and its check records), the baseline and the A/B and bisect
    records. The baseline: `baseline_path`, else the one the latest checked night used (where it is readable)."""
    from harness.regression.baseline import load_baseline

    history_dir = layout.path(results, layout.HISTORY)
    rows = read_history(history_dir)
    if not rows:
        raise HarnessError(f"{history_dir}: no history rows (`remax-bench history append` adds a pipeline run)")
    problems: list[str] = []
    checks = read_checks(history_dir, problems)
    if baseline_path is None and checks:
        latest = max(checks.values(), key=lambda r: str(r.get("pipeline_time", "")))
        named = Path(str(latest.get("baseline", "")))
        baseline_path = named if named.is_file() else None
    baseline = load_baseline(baseline_path) if baseline_path else None
    comparisons = read_comparisons(results, out_dir, problems)
    frameworks = []
    for fw in sorted({r["framework"] for r in rows}):
        nights = _nights([r for r in rows if r["framework"] == fw])
        marks = _marks(nights, checks, fw)
        bands = _baseline_bands(baseline, fw)
        mine = [c for c in comparisons if c["framework"] in (fw, None)]
        charts = [c for t, name, d, watched in CHARTS
                  if (c := _chart(t, name, d, watched, nights, marks, bands.get(name), mine)) is not None]
        alerted = [dict(time=n["time"], run=n["run"], commit=n["commit"][:12], said="; ".join(
            f"{c.get('label', c.get('metric'))} {_change(c)}" for c in marks[n["run"]]["regressions"]))
            for n in nights if marks.get(n["run"], {}).get("regressions")]
        frameworks.append(dict(name=fw, nights=len(nights), first=nights[0]["time"], last=nights[-1]["time"],
                               charts=charts, alerted=alerted))
    return dict(results=str(results), frameworks=frameworks, comparisons=comparisons, problems=problems,
                baseline=str(baseline_path) if baseline_path else None, checked=len(checks),
                width=WIDTH, height=HEIGHT, left=LEFT, right=RIGHT, top=TOP, bottom=BOTTOM)


def history_html(results: str | Path, out_dir: str | Path, baseline_path: str | Path | None = None) -> str:
    view = history_view(Path(results), Path(out_dir), Path(baseline_path) if baseline_path else None)
    page = environment().get_template("history.html.j2").render(**view)
    return page.encode("ascii", "xmlcharrefreplace").decode("ascii")


def write_history_page(results: str | Path, out_dir: str | Path, baseline_path: str | Path | None = None) -> Path:
    """RESULTS' history as OUT/history.html; returns its path."""
    from harness.io import write_text

    out = Path(out_dir) / "history.html"
    write_text(out, history_html(results, out_dir, baseline_path), role=PAGE_ROLE)
    return out
