"""Is B slower than A? (`remax-bench ab`, `bisect`, `nightly`; docs/regression.md): the paired statistics on series
whose truth is known, a real A/B of two commits of this repository where B's code is slower (as the nightly job runs
it against a baseline's commit), and bad arms and baselines refused before anything runs."""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from conftest import REPO, clone_with_commit, run_cli

from harness import HarnessError
from harness.comparison.ab import EQUAL_SPEED, PROBE, RECORD_ROLE, _seed_rows, decision_basis
from harness.comparison.paired import decide, look_alpha
from harness.io import write_json
from harness.results.student_t import t_quantile

# One short config both arms run: 2 seeds of the reference backend, a few seconds a run; 60 steps so that a run's
# trailing reward window starts empty (NaN), as in any real profile.
AB_CONFIG = {"profile": "ab-test", "seeds": [1, 2], "frameworks": ["reference"],
             "task": {"kind": "addition", "digits": 2, "n_train": 200, "n_eval": 8},
             "policy": {"hidden_size": 32, "intermediate_size": 64, "num_layers": 1, "num_heads": 2,
                        "sft": {"steps": 5, "batch_size": 16}},
             "reward": {"kind": "rule"},
             "remax": {"steps": 60, "warmup_steps": 5, "train_batch_size": 4, "rollout_n": 2,
                       "max_response_length": 8},
             "reference": {"device": "cpu", "threads": 1, "eval_batch_size": 8}}
# A slower line of code, as a change to the policy's forward pass would bring: a needless decomposition on every call
# (generation, log-probs, training), which changes no number the run computes. It makes B about 3-4x slower: on a
# shared 2-core VM one process runs up to 2x slower than the next at the same commit (its CPU time too, and the
# machine probe with it), which a 2x slowdown did not always outrun within the test's 10 pairs (CI, 2026-12-04).
SLOW_LINE = ("        rows, width = tokens.shape\n",
             "        rows, width = tokens.shape\n        torch.linalg.eigvalsh(torch.eye(288) + 0.01)\n")
MODEL = "harness/frameworks/reference/model.py"


def test_t_quantiles_match_the_published_table():
    # Student's t, two-sided: Fisher and Yates' table (also Abramowitz and Stegun table 26.10).
    for alpha, dof, table in ((0.05, 1, 12.706), (0.05, 2, 4.303), (0.05, 10, 2.228), (0.01, 4, 4.604),
                              (0.001, 5, 6.869), (0.05, 30, 2.042)):
        assert t_quantile(alpha, dof) == pytest.approx(table, abs=5e-4)


def sequence(rng: np.random.Generator, ratio: float, noise: float, max_pairs: int = 12, min_pairs: int = 3,
             alpha: float = 0.01) -> dict:
    """One A/B as `ab` runs it, on pairs whose log ratio B/A is drawn around log(ratio)."""
    draws = list(rng.normal(math.log(ratio), noise, max_pairs))
    for n in range(min_pairs, max_pairs + 1):
        verdict = decide(draws[:n], level=look_alpha(alpha, min_pairs, max_pairs), resolution=0.03,
                         final=n == max_pairs)
        if verdict["verdict"] != "continue":
            return verdict
    raise AssertionError("the last look must decide")


def test_a_known_slowdown_is_recovered_inside_its_interval_and_called_slower():
    rng = np.random.default_rng(7)
    verdicts = [sequence(rng, 0.90, 0.02) for _ in range(200)]  # B 10% slower, 2% noise per pair
    assert sum(v["verdict"] == "slower" for v in verdicts) >= 195
    inside = [v["low"] <= 0.10 <= v["high"] for v in verdicts if v["verdict"] == "slower"]
    assert sum(inside) >= 0.97 * len(inside)  # each look's interval is at 1 - level, wider than 95%
    assert verdicts[0]["text"].startswith("B is ") and "% slower (CI " in verdicts[0]["text"]


def test_a_against_a_is_not_called_slower_beyond_the_stated_rate_over_all_looks():
    rng = np.random.default_rng(11)
    verdicts = [sequence(rng, 1.0, 0.03) for _ in range(4000)]
    called = sum(v["verdict"] in ("slower", "faster") for v in verdicts) / len(verdicts)
    assert called <= 0.01, called  # alpha 0.01 over the whole sequence of looks
    same = [v for v in verdicts if v["verdict"] == "same"]
    assert same and all(max(abs(v["low"]), abs(v["high"])) <= 0.03 for v in same)
    assert same[0]["text"].startswith("no difference larger than ")


def test_the_boundary_holds_a_against_a_to_alpha_over_a_hundred_looks_at_several_times_bonferronis_level():
    """paired.look_alpha is set on its own simulated paths; here other paths (another seed, another spread) take
    every look from pair 3 to 100 at that level: the chance that any look calls A against A different is alpha
    within 3 standard errors, where Bonferroni's alpha / 98 would hold it to about a sixth of that (and need about
    30% more pairs to see the same change)."""
    level = look_alpha(0.01, 3, 100)
    assert level > 4 * 0.01 / 98, level
    rng = np.random.default_rng(99)
    x = rng.normal(0.0, 0.047, (20_000, 100))
    n = np.arange(1, 101)
    mean = x.cumsum(axis=1) / n
    sd = np.sqrt(np.maximum((x * x).cumsum(axis=1) - n * mean ** 2, 0)[:, 2:] / (n[2:] - 1))
    t = np.abs(mean[:, 2:]) / (sd / np.sqrt(n[2:]))
    called = (t > np.array([t_quantile(level, k - 1) for k in n[2:]])).any(axis=1).mean()
    assert abs(called - 0.01) <= 3 * math.sqrt(0.01 * 0.99 / len(x)), called


def test_a_seed_with_one_pair_has_no_interval_and_the_record_is_still_written(tmp_path):
    """A verdict after 3 pairs of 2 seeds leaves seed 2 one pair: its interval is unknown (null), not Infinity, which
    ab.json cannot hold (found in CI: the A/B ended without its record)."""
    pairs = [{"seed": s, "A_throughput_tok_s": 100.0, "B_throughput_tok_s": b} for s, b in ((1, 30.0), (2, 28.0),
                                                                                            (1, 29.0))]
    rows = {r["seed"]: r for r in _seed_rows(pairs, 0.01)}
    assert rows[2]["pairs"] == 1 and rows[2]["low"] is None and rows[2]["high"] is None
    assert rows[1]["low"] is not None and rows[1]["low"] < rows[1]["ratio"] < rows[1]["high"]
    write_json(tmp_path / "ab.json", {"per_seed": list(rows.values())}, role=RECORD_ROLE)
    assert json.loads((tmp_path / "ab.json").read_text())["per_seed"][1]["high"] is None


def test_the_page_shows_no_interval_too_wide_to_bound_a_change(tmp_path):
    """Issue 53: a seed's row with one or two pairs printed "-100.0% to +1478349399804444409856.0%" and "n/a to n/a"
    (t with 1 degree of freedom at the looks' level). A row of fewer than 3 pairs says so, one of more whose interval
    is too wide to bound a change says that, and the figure draws no such bar; a row with pairs enough keeps its
    interval."""
    from harness.report.ab import _interval

    pairs = [{"seed": s, "A_throughput_tok_s": 100.0, "B_throughput_tok_s": b}
             for s, b in ((1, 95.0), (1, 60.0), (2, 95.0), (3, 95.0), (3, 95.2), (3, 94.9), (3, 95.1), (4, 95.0),
                          (4, 40.0), (4, 150.0))]
    rows = {r["seed"]: r for r in _seed_rows(pairs, 0.001)}
    assert _interval(rows[1]) == "too few pairs to bound (2)" and rows[1]["high"] / rows[1]["low"] > 1000
    assert _interval(rows[2]) == "too few pairs to bound (1)"
    assert _interval(rows[3]).startswith("-5.") and " to -4." in _interval(rows[3]), _interval(rows[3])
    assert _interval(rows[4]) == "too wide to bound with 3 pairs", rows[4]


def test_too_few_pairs_for_the_noise_is_inconclusive_with_the_pairs_needed():
    verdict = sequence(np.random.default_rng(3), 1.0, 0.2, max_pairs=4)
    assert verdict["verdict"] == "inconclusive" and verdict["more_pairs"] > 0
    assert verdict["text"].startswith(f"inconclusive: about {verdict['more_pairs']} more pairs needed")


def _probed_pairs(rng: np.random.Generator, ratio: float, probe_ratio: float, n: int = 12) -> list[dict]:
    """Pairs as a shared CPU gives them: each run's machine speed drifts by up to 50%, slowing its steps and its probe
    alike; B's code is `ratio` as fast as A's, and B's probe `probe_ratio` as fast."""
    pairs = []
    for _ in range(n):
        speed = rng.uniform(1.0, 1.5, 2)  # each run's slowdown from the machine
        probe = 1e-3 * speed * (1.0, 1 / probe_ratio) * rng.lognormal(0, 0.01, 2)
        tokens = 1e4 / speed * (1.0, ratio) * rng.lognormal(0, 0.01, 2)
        pairs.append({f"{arm}_{k}": v for i, arm in enumerate("AB") for k, v in (
            ("throughput_tok_s", tokens[i]), (PROBE, probe[i]), (EQUAL_SPEED, tokens[i] * probe[i]))})
    return pairs


def test_the_machines_drift_cancels_at_equal_machine_speed_unless_the_probe_itself_tells_the_arms_apart():
    rng = np.random.default_rng(11)
    pairs = _probed_pairs(rng, 0.95, 1.0)
    basis = decision_basis(pairs, True, 0.001)
    assert basis == EQUAL_SPEED
    verdict = decide([math.log(p[f"B_{basis}"] / p[f"A_{basis}"]) for p in pairs], level=0.001, resolution=0.03,
                     final=True)
    assert verdict["verdict"] == "slower" and verdict["low"] < 0.05 < verdict["high"], verdict
    raw = decide([math.log(p["B_throughput_tok_s"] / p["A_throughput_tok_s"]) for p in pairs], level=0.001,
                 resolution=0.03, final=True)
    assert raw["verdict"] == "inconclusive"  # the same pairs as measured: the drift hides 5%
    # B's probe twice as slow: the probe no longer measures only the machine, and dividing by it would cancel B's
    # slowdown. A smaller change of the probe hides in the drift: probe_comparable keeps out every arm whose probe
    # does other work (below); so is a run without a probe.
    assert decision_basis(_probed_pairs(rng, 0.95, 0.5), True, 0.001) == "throughput_tok_s"
    assert decision_basis(pairs, False, 0.001) == "throughput_tok_s"
    assert decision_basis([{**pairs[0], f"B_{EQUAL_SPEED}": None}, *pairs[1:]], True, 0.001) == "throughput_tok_s"


def test_the_probe_divides_only_where_both_arms_run_the_same_probe_code_with_the_same_settings(tmp_path):
    from harness.comparison.ab import PROBE_MODULE, probe_comparable
    from harness.comparison.arms import Arm

    def arm(label: str, probe_edit: tuple[str, str] | None = None, reference: dict | None = None) -> Arm:
        tree = tmp_path / label
        (tree / PROBE_MODULE).parent.mkdir(parents=True)
        text = (REPO / PROBE_MODULE).read_text()
        (tree / PROBE_MODULE).write_text(text.replace(*probe_edit) if probe_edit else text)
        config = tmp_path / f"{label}.json"
        config.write_text(json.dumps({"reference": reference or {"device": "cpu", "threads": 1}}))
        return Arm(label, label, tree=tree, config=config)

    a = arm("A")
    assert probe_comparable((a, arm("B")), None)
    assert not probe_comparable((a, arm("B2")), "verl-cpu")  # a planned framework's runs have no probe of ours
    assert not probe_comparable((a, arm("B3", reference={"device": "cpu", "threads": 2})), None)
    assert probe_comparable((a, arm("B4", ("The probe's operands", "Its operands"))), None)  # a comment only
    assert not probe_comparable((a, arm("B5", ("for _ in range(8):", "for _ in range(9):"))), None)
    wider = ("torch.randn(64, 64, generator=g)", "torch.randn(64, 96, generator=g)")
    assert not probe_comparable((a, arm("B6", wider)), None)


def test_a_pairs_runs_go_side_by_side_only_where_each_has_cores_of_its_own(tmp_path):
    from harness.comparison.ab import side_by_side
    from harness.comparison.arms import Arm

    def arm(label: str, reference: dict, device: str = "cpu", openrlhf: int = 18642) -> Arm:
        config = tmp_path / f"{label}.json"
        config.write_text(json.dumps({"reference": reference, "launch": {"device": device},
                                      "openrlhf": {"reward_port": openrlhf}}))
        return Arm(label, label, config=config)

    cores = sorted(os.sched_getaffinity(0))
    one = {"device": "cpu", "threads": 1}
    assert side_by_side((arm("A", one), arm("B", one)), None, "reference") == (
        [[cores[0]], [cores[1]]] if len(cores) >= 2 else None)
    for other in ({"device": "cpu", "threads": 0},  # torch's own count: every core
                  {"device": "cpu", "threads": len(cores)},  # no room for a second run
                  {"device": "cuda", "threads": 1}):
        assert side_by_side((arm("A", other), arm("B", other)), None, "reference") is None, other
    assert side_by_side((arm("A", one), arm("B", {"device": "cpu", "threads": 2})), None, "reference") is None
    # A planned framework on the CPU: half the cores each (its processes inherit the set), where its settings agree;
    # on GPUs never (a GPU node's runs each take the whole node).
    half = len(cores) // 2
    assert side_by_side((arm("A", one), arm("B", one)), "openrlhf-cpu", "openrlhf") == (
        [cores[:half], cores[half:]] if len(cores) >= 2 else None)
    assert side_by_side((arm("A", one, "cuda"), arm("B", one, "cuda")), "openrlhf", "openrlhf") is None
    assert side_by_side((arm("A", one), arm("B", one, openrlhf=18643)), "openrlhf-cpu", "openrlhf") is None


def test_the_smallest_change_a_budget_sees_is_called_slower_at_least_four_times_in_five():
    """detectable_change on pairs of known spread: at that slowdown the t test at the looks' level calls B slower in
    80-90% of simulated A/Bs of that many pairs (never less than it promises), at half of it far less often."""
    from harness.comparison.paired import detectable_change

    rng = np.random.default_rng(7)
    sd = 0.08

    def called_slower(slowdown: float, level: float, pairs: int) -> float:
        x = rng.normal(math.log1p(-slowdown), sd, (20000, pairs))
        high = x.mean(1) + t_quantile(level, pairs - 1) * x.std(1, ddof=1) / math.sqrt(pairs)
        return float((high < 0).mean())

    for max_pairs, pairs in ((12, 10), (15, 14), (100, 4), (100, 30)):
        level = look_alpha(0.01, 3, max_pairs)
        change = detectable_change(list(rng.normal(0, sd, 20000)), level, pairs)
        assert change is not None
        assert 0.79 <= called_slower(change, level, pairs) <= 0.9, (max_pairs, pairs)
        assert called_slower(change / 2, level, pairs) < 0.3, (max_pairs, pairs)
    assert detectable_change([0.01], look_alpha(0.01, 3, 12), 10) is None  # one pair: no spread yet


@pytest.fixture(scope="module")
def two_commits(tmp_path_factory):
    """A clone of this repository's HEAD with one commit on top that makes the policy's forward pass slower."""
    root = tmp_path_factory.mktemp("ab")
    clone = clone_with_commit(root / "repo", MODEL, SLOW_LINE, "a slower forward pass")
    config = root / "ab.yaml"
    config.write_text(yaml.safe_dump(AB_CONFIG))
    return clone, config


def test_bad_arms_are_refused_before_anything_runs_naming_the_arm(two_commits, tmp_path):
    clone, config = two_commits
    out = tmp_path / "ab"
    proc = run_cli("ab", "--a", "HEAD~1", "--b", "no-such-ref", "--config", config, "--out", out, cwd=clone)
    assert proc.returncode == 2 and "arm B: 'no-such-ref' is not a commit" in proc.stderr, proc.stderr

    dirty = tmp_path / "dirty"
    subprocess.run(["git", "clone", "-q", str(clone), str(dirty)], check=True)
    (dirty / MODEL).write_text((dirty / MODEL).read_text() + "\n# uncommitted\n")
    proc = run_cli("ab", "--a", "HEAD", "--b", dirty, "--config", config, "--out", out, cwd=clone)
    assert proc.returncode == 2 and f"arm B: {dirty} has uncommitted changes" in proc.stderr, proc.stderr

    # A harness from before `remax-bench train`, the one way an arm trains a run, is refused before it builds or runs.
    old = tmp_path / "old"
    subprocess.run(["git", "clone", "-q", str(clone), str(old)], check=True)
    who = ["-c", "user.name=remax-bench test", "-c", "user.email=test@remax-bench.invalid"]
    subprocess.run(["git", "-C", str(old), *who, "rm", "-q", "harness/runs/train.py"], check=True)
    subprocess.run(["git", "-C", str(old), *who, "commit", "-qm", "before train"], check=True)
    proc = run_cli("ab", "--a", "HEAD", "--b", old, "--config", config, "--out", out, cwd=clone)
    assert proc.returncode == 2 and "its harness has no `remax-bench train` (harness/runs/train.py)" in proc.stderr, \
        proc.stderr

    proc = run_cli("ab", "--a", "HEAD", "--b", "HEAD", "--b-set", '{"task": {"n_train": 300}}', "--config", config,
                   "--out", out, cwd=clone)
    assert proc.returncode == 2 and "would not train the same framework on the same inputs: task.n_train: 200 " \
        "against 300" in proc.stderr, proc.stderr

    # A framework version the arm names but that does not exist, or that its framework does not run in.
    proc = run_cli("ab", "--a", "HEAD", "--b", "HEAD", "--b-env", "verl-cpu=no-such.txt", "--config", config,
                   "--out", out, cwd=clone)
    assert proc.returncode == 2 and "arm B: --b-env verl-cpu=no-such.txt: no such description file" in proc.stderr
    proc = run_cli("ab", "--a", "HEAD", "--b", "HEAD", "--b-env", "verl-cpu", "--config", config, "--out", out,
                   cwd=clone)
    assert proc.returncode == 2 and "--b-env 'verl-cpu': expected NAME=DESCRIPTION_FILE" in proc.stderr
    spec = REPO / "harness" / "frameworks" / "verl" / "envs" / "verl-cpu.txt"
    proc = run_cli("ab", "--a", "HEAD", "--b", "HEAD", "--a-env", f"verl-cpu={spec}", "--config", config, "--out", out,
                   cwd=clone)
    assert proc.returncode == 2 and "arm A: --a-env verl-cpu: reference runs under this config in the harness " \
        "environment (embedded), not in verl-cpu" in proc.stderr, proc.stderr
    assert not out.exists() and not list(tmp_path.glob(".ab.*"))  # nothing half-made
    listed = subprocess.run(["git", "-C", str(clone), "worktree", "list"], capture_output=True, text=True).stdout
    assert len(listed.splitlines()) == 1


def test_with_a_split_a_commit_is_placed_on_its_side_in_few_pairs_despite_noise_too_large_for_no_difference():
    """Bisect's question. At 10% noise per pair, proving "no difference within 3%" would take hundreds of pairs; which
    side of half of a 40% slowdown a commit lies on takes a handful."""
    rng = np.random.default_rng(5)
    split = 1 - math.sqrt(0.6)
    fast = [sequence_split(rng, 1.0, split) for _ in range(200)]
    slow = [sequence_split(rng, 0.6, split) for _ in range(200)]
    assert sum(v["verdict"] == "not slower" for v in fast) >= 190 and not any(v["verdict"] == "slower" for v in fast)
    assert sum(v["verdict"] == "slower" for v in slow) >= 190 and not any(v["verdict"] == "not slower" for v in slow)
    assert sorted(v["pairs"] for v in fast + slow)[len(fast)] <= 7  # the median comparison stops by its 7th pair


def sequence_split(rng: np.random.Generator, ratio: float, split: float) -> dict:
    draws = list(rng.normal(math.log(ratio), 0.1, 12))
    for n in range(3, 13):
        verdict = decide(draws[:n], level=0.001, resolution=0.03, final=n == 12, split=split)
        if verdict["verdict"] != "continue":
            return verdict
    raise AssertionError("the last look must decide")


def test_an_arms_framework_version_is_the_environment_its_runs_launch_with(tmp_path, monkeypatch):
    """`--b-env NAME=FILE`: B's environment is built from that description in B's own folder; one built from the
    same description is lent (a link), never built again or built over; the record lists the packages that differ;
    and a planned framework's launch, planned with that folder (REMAX_BENCH_ENVS, what `ab` gives each arm's CLI),
    runs that folder's python."""
    from conftest import make_inputs, tiny_cpu_config

    from harness.comparison.ab import package_changes
    from harness.comparison.arms import Arm, arm_environment
    from harness.runtime import envs

    tree = tmp_path / "tree"  # an arm's checkout: its own description of the environment
    (tree / "harness" / "frameworks" / "tiny" / "envs").mkdir(parents=True)
    (tree / "harness" / "frameworks" / "tiny" / "envs" / "tiny.txt").write_text("# the default version\n")
    monkeypatch.setattr(envs, "FRAMEWORK_FOLDERS", tree / "harness" / "frameworks")  # this checkout's: the same
    monkeypatch.setattr(envs, "ENV_ROOT", tmp_path / "shared")
    newer = tmp_path / "newer.txt"
    newer.write_text("smmap==5.0.3\n")  # pure Python, pinned as requirements.lock does
    made: dict = {}
    arms = {label: Arm(label, "HEAD", commit="c" * 40, tree=tree, envs=override) for label, override in
            (("A", {}), ("B", {"tiny": newer}), ("C", {"tiny": newer}))}
    built = {label: arm_environment(arm, "tiny", tmp_path / "envs" / label, made, say=print)
             for label, arm in arms.items()}
    assert (tmp_path / "envs" / "A" / "tiny").resolve() == (tmp_path / "shared" / "tiny").resolve()
    assert not (tmp_path / "envs" / "B" / "tiny").is_symlink()  # built from B's description, in B's folder
    assert (tmp_path / "envs" / "C" / "tiny").resolve() == (tmp_path / "envs" / "B" / "tiny").resolve()
    assert not any(p.startswith("smmap") for p in built["A"]["packages"])
    record = {"arms": {"A": {"envs": {"tiny": built["A"]}}, "B": {"envs": {"tiny": built["B"]}}}}
    assert package_changes(record) == {"smmap": (None, "5.0.3")}

    raw = tiny_cpu_config()
    config_path, _ = make_inputs(tmp_path, raw)
    folder = tmp_path / "envs" / "B"
    proc = subprocess.run([str(Path(sys.executable).parent / "remax-bench"), "plan", "verl", "--config", config_path,
                           "--seed", "1", "--inputs", tmp_path / "inputs", "--out", tmp_path / "plan"],
                          env={**os.environ, "REMAX_BENCH_ENVS": str(folder)}, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert str(folder / "verl-cpu" / "bin" / "python") in (tmp_path / "plan" / "launch.sh").read_text()


def test_the_snakemake_target_passes_the_framework_and_the_arms_environments_to_ab(tmp_path):
    from conftest import snakemake

    micro = REPO / "workflows" / "config" / "micro.yaml"
    proc = snakemake(tmp_path, "-n", "-p", "ab", "--configfile", micro, "--config",
                     "ab={a: HEAD, b: HEAD, framework: reference, b_env: [dschat-cpu=ds 0.19.7.txt]}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "remax-bench ab --a HEAD --b HEAD --framework reference --b-env 'dschat-cpu=ds 0.19.7.txt' --config" \
        in proc.stdout, proc.stdout[-3000:]
    proc = snakemake(tmp_path, "-n", "ab", "--configfile", micro, "--config", "ab={a: HEAD, b_env: [x]}")
    assert proc.returncode != 0 and "ab must name both arms" in proc.stdout + proc.stderr


def test_bisect_takes_a_confirming_ab_as_its_first_round_only_if_it_compared_good_and_bad_as_bisect_would(tmp_path):
    """`bisect GOOD BAD --confirmed-by DIR` (what a nightly alert prints after its `ab`) reuses that A/B instead of
    running GOOD against BAD again; any A/B of other commits, config, override, environment or verdict is refused,
    naming what differs."""
    from harness.comparison.bisect import confirmed

    config = tmp_path / "ab.yaml"
    config.write_text(yaml.safe_dump(AB_CONFIG))
    good, bad = "a" * 40, "b" * 40
    record = {"framework": "reference", "verdict": {"verdict": "slower", "text": "B is 70.0% slower"},
              "arms": {"A": {"commit": good, "override": {}}, "B": {"commit": bad, "override": {}}},
              "config_sha256": hashlib.sha256(config.read_bytes()).hexdigest(),
              "command": f"remax-bench ab --framework reference --a {good} --b {bad} --config {config} --out x"}

    def check(**changes):
        ab = tmp_path / "ab"
        ab.mkdir(exist_ok=True)
        (ab / "ab.json").write_text(json.dumps({**record, **changes}))
        return confirmed(ab, good, bad, config, "reference")

    assert check()["verdict"]["verdict"] == "slower"
    refused = {
        "arm B ran cccccccccccc, not bbbbbbbbbbbb": {"arms": {**record["arms"], "B": {"commit": "c" * 40}}},
        "arm A had a config override": {"arms": {**record["arms"], "A": {"commit": good, "override": {"x": 1}}}},
        "an arm ran an environment of its own": {"command": record["command"] + " --b-env dschat-cpu=x.txt"},
        "it ran another config than": {"config_sha256": "0" * 64},
        "it ran verl, not reference": {"framework": "verl"},
        "its verdict is 'no difference larger than 2.0%', not slower": {
            "verdict": {"verdict": "same", "text": "no difference larger than 2.0%"}},
        "arm A ran None, not aaaaaaaaaaaa; arm B ran None": {"arms": ["not", "a", "mapping"]},
        "its verdict is None, not slower": {"verdict": "slower"},
    }
    for message, changes in refused.items():
        with pytest.raises(HarnessError, match=re.escape(message)):
            check(**changes)


def _baseline_of(made_by: str, path: Path, **git) -> Path:
    """A real baseline (the shipped cpu one) whose runs were made by commit `made_by`: the accepted baseline of a
    night. `git`: other fields of its git record (a dirty checkout, no commit)."""
    baseline = json.loads((REPO / "baselines" / "cpu.json").read_text())
    for entry in baseline["frameworks"].values():
        entry["provenance"]["git"] = {"commit": made_by, "dirty": False, **git}
    path.write_text(json.dumps(baseline))
    return path


def test_the_nightly_ab_calls_the_slower_commit_slower_its_behaviour_unchanged_and_names_it(two_commits, tmp_path):
    """`nightly`, with the baseline made by HEAD~1 and tonight's commit HEAD (a slower forward pass): its paired A/B
    (one real `ab` of two commits, which the assertions on the A/B itself share) confirms it within the budget, the
    alert names HEAD as the first slow commit (HEAD~1's child: no bisection round needed), and the record reaches the
    history, the job summary and the JUnit report."""
    clone, config = two_commits
    head, good = (subprocess.run(["git", "-C", str(clone), "rev-parse", ref], capture_output=True, text=True,
                                 check=True).stdout.strip() for ref in ("HEAD", "HEAD~1"))
    out, results = tmp_path / "nightly", tmp_path / "results"
    proc = run_cli("nightly", "--baseline", _baseline_of(good, tmp_path / "baseline.json"), "--config", config,
                   "--out", out, "--results", results, "--max-pairs", 10, "--budget", 10, cwd=clone)
    assert (out / "ab" / "ab.json").is_file(), proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]  # exit 1: confirmed slower
    record = json.loads((out / "nightly.json").read_text())
    assert (record["a"], record["b"], record["outcome"]) == (good, head, "slower")
    assert record["ab"]["low"] > 0 and record["ab"]["pairs"] <= 10 and record["ab"]["minutes"] <= 10
    assert record["bisect"] == {"first_slow": head, "subject": "a slower forward pass", "rounds": 0}
    assert f"first slow commit {head[:12]}" in proc.stdout.splitlines()[-1]
    junit = (out / "junit.xml").read_text()
    assert 'failures="1"' in junit and "confirmed slowdown" in junit and "CI +" in junit
    # What the budget can see, at the spread measured tonight, in every verdict: a change above 0, below 100%.
    detectable = record["ab"]["detectable"]
    assert 0 < detectable["change"] < 1 and detectable["pairs"] >= record["ab"]["pairs"]
    assert detectable["text"] in junit and detectable["text"] in (out / "summary.md").read_text()
    assert f"`{head}` (a slower forward pass)" in (out / "summary.md").read_text()
    [kept] = (results / "history" / "nightly").glob("[!.]*.json")  # not the harness's hidden record of its writes
    assert json.loads(kept.read_text()) == record
    _check_the_real_ab(out / "ab", clone)


def _check_the_real_ab(out: Path, clone: Path) -> None:
    """The A/B of HEAD~1 against HEAD that the nightly ran: slower, side by side, at equal machine speed, and the
    same numbers computed (only speed changed)."""
    ab = json.loads((out / "ab.json").read_text())
    assert ab["verdict"]["verdict"] == "slower" and ab["verdict"]["change"] > 0 and ab["verdict"]["low"] > 0
    # Both runs of a pair at once where the machine has a core for each run's one thread, the arms swapping cores
    # from pair to pair (the first run of "AB" on the first set); else ABBA.
    cores = sorted(os.sched_getaffinity(0))
    assert ab["side_by_side"] == ([[cores[0]], [cores[1]]] if len(cores) >= 2 else None)
    assert [p["order"] for p in ab["pairs"]][:2] == ["AB", "BA"]
    assert [p["seed"] for p in ab["pairs"]][:2] == [1, 2]
    # The verdict's interval is the decided figure's; tokens/s as measured carries the machine's drift, and with the
    # two pairs a clear slowdown stops at its interval is wide (t with one degree of freedom): only its ratio is held.
    tokens = next(r for r in ab["phases"] if r["figure"] == "tokens/s")
    assert tokens["ratio"] < 1, ab["phases"]
    # One harness environment, one reference section: decided at equal machine speed, the probe shown beside it.
    assert ab["decided_on"] == "tokens/s at equal machine speed" and ab["verdict"]["basis"] == EQUAL_SPEED
    assert {"tokens/s at equal machine speed", "machine-speed probe (time)"} <= {r["figure"] for r in ab["phases"]}
    # The slower line changes no number the runs compute: each seed's curves are identical, only speed changed.
    assert ab["behaviour"] and all(b["identical"] for b in ab["behaviour"]), ab["behaviour"]
    page = (out / "index.md").read_text()
    assert ab["verdict"]["text"] in page and (out / "ab.png").stat().st_size > 0
    listed = subprocess.run(["git", "-C", str(clone), "worktree", "list"], capture_output=True, text=True).stdout
    assert len(listed.splitlines()) == 1  # the arms' worktrees are gone


def test_the_nightly_job_with_no_commit_since_the_baselines_runs_nothing_and_does_not_alert(two_commits, tmp_path):
    clone, config = two_commits
    head = subprocess.run(["git", "-C", str(clone), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    proc = run_cli("nightly", "--baseline", _baseline_of(head, tmp_path / "baseline.json"), "--config", config,
                   "--out", tmp_path / "nightly", cwd=clone)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    record = json.loads((tmp_path / "nightly" / "nightly.json").read_text())
    assert record["outcome"] == "unchanged" and record["ab"] is None
    assert "<skipped" in (tmp_path / "nightly" / "junit.xml").read_text()


@pytest.mark.parametrize(("git", "framework", "named"), [
    ({"dirty": True}, None, "uncommitted changes"),
    ({"commit": None}, None, "records no harness commit"),
    ({}, "verl", "no baseline for framework 'verl'"),
    ({"commit": "--output=/tmp/x"}, None, "provenance.git.commit: expected a full hex commit id"),
])
def test_a_baseline_the_nightly_job_cannot_stand_on_is_refused_before_anything_runs(two_commits, tmp_path, git,
                                                                                     framework, named):
    clone, config = two_commits
    baseline = _baseline_of("a" * 40, tmp_path / "baseline.json", **git)
    proc = run_cli("nightly", "--baseline", baseline, "--config", config, "--out", tmp_path / "nightly",
                   *(["--framework", framework] if framework else []), cwd=clone)
    assert proc.returncode == 2 and named in proc.stderr, proc.stdout + proc.stderr
    assert not (tmp_path / "nightly").exists()


def test_the_nightly_job_of_a_profile_that_lists_every_framework_confirms_the_reference_unless_told(tmp_path):
    """The shipped profiles list all five frameworks: `snakemake nightly` with no framework named A/Bs the harness's
    own reference backend; a config of several frameworks without it must name one."""
    from harness.comparison.nightly import _framework

    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"frameworks": ["reference", "verl", "openrlhf", "dschat", "trl"]}))
    assert _framework(config, None) == "reference" and _framework(config, "openrlhf") == "openrlhf"
    config.write_text(yaml.safe_dump({"frameworks": ["verl", "openrlhf"]}))
    with pytest.raises(HarnessError, match=r"frameworks \['verl', 'openrlhf'\]; the nightly A/B runs one framework"):
        _framework(config, None)


def test_the_nightly_targets_options_are_checked_before_anything_runs():
    from harness.config import nightly_from_config

    assert nightly_from_config({"framework": "openrlhf", "budget": 45, "max_pairs": 15}, "--config") == [
        "--framework", "openrlhf", "--budget", "45", "--max-pairs", "15"]
    for bad in ({"max_pairs": 2}, {"max_pairs": 15.5}, {"budget": 0}, {"framework": "--out=/x"}, {"pairs": 3}):
        with pytest.raises(HarnessError, match=r"--config: nightly may name the framework .* most pairs \(3-500\)"):
            nightly_from_config(bad, "--config")
