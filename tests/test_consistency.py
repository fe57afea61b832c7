"""The verdict per figure of a rerun on another machine (harness.results.consistency): its family false-alarm rate and
its margin hold as stated, by simulation of normal seed figures correlated as a run's figures are."""

import numpy as np
import pandas as pd
import pytest

from harness.results.consistency import FAMILY_FALSE_ALARM, POWER, seeds_for_one_spread, throughput_shares, verdicts

FRAMEWORKS, FIGURES, SEEDS = 5, 6, 3


def comparison(rng, shift: float = 0.0) -> pd.DataFrame:
    """Tidy figures of an original and a rerun, 3 seeds each; a seed's figures share most of their noise (a run that
    learned fast has a higher gain, final reward and accuracy at once). `shift` (in seed spreads) moves one figure of
    one framework in the rerun."""
    rows = []
    for side in ("original", "rerun"):
        for fw in range(FRAMEWORKS):
            for seed in range(SEEDS):
                common = rng.normal()
                for fig in range(FIGURES):
                    moved = shift if (side, fw, fig) == ("rerun", 0, 0) else 0.0
                    rows.append((side, f"fw{fw}", seed, f"figure{fig}", 0.8 * common + 0.6 * rng.normal() + moved))
    return pd.DataFrame(rows, columns=["side", "framework", "seed", "figure", "value"])


def test_a_rerun_of_the_same_experiment_is_called_not_consistent_at_most_at_the_stated_rate():
    rng = np.random.default_rng(20261206)
    trials = 600
    alarms = sum((verdicts(comparison(rng))["verdict"] == "not consistent").any() for _ in range(trials))
    # Holm bounds the rate by FAMILY_FALSE_ALARM for any correlation; 3 binomial standard errors of slack
    assert alarms / trials <= FAMILY_FALSE_ALARM + 3 * np.sqrt(FAMILY_FALSE_ALARM * (1 - FAMILY_FALSE_ALARM) / trials)


def test_a_difference_of_the_stated_margin_is_called_not_consistent_about_as_often_as_stated():
    rng = np.random.default_rng(7)
    table = verdicts(comparison(rng))
    spreads = float(table["margin_spreads"].iloc[0])  # the margin in seed spreads, for 3 seeds a side and 30 figures
    assert 5 < spreads < 9  # wide: the page says so, and how many seeds a narrower one needs
    caught = [verdicts(comparison(rng, shift=spreads))
              for _ in range(200)]
    rate = np.mean([t.loc[(t["framework"] == "fw0") & (t["figure"] == "figure0"), "verdict"].item() == "not consistent"
                    for t in caught])
    assert rate >= POWER - 0.1, rate
    assert seeds_for_one_spread(FAMILY_FALSE_ALARM / (FRAMEWORKS * FIGURES)) == table["seeds_for_one_spread"].iloc[0]


def test_figures_the_seed_does_not_move_must_be_equal_and_one_seed_a_side_is_untested():
    rows = [("original", "a", s, "step0_agreement", 0.9) for s in (1, 2, 3)]
    rows += [("rerun", "a", s, "step0_agreement", 0.9) for s in (1, 2, 3)]
    rows += [("original", "b", s, "step0_agreement", 0.9) for s in (1, 2, 3)]
    rows += [("rerun", "b", s, "step0_agreement", 0.85) for s in (1, 2, 3)]
    rows += [("original", "c", 1, "reward_gain", 0.5), ("rerun", "c", 1, "reward_gain", 0.1)]
    table = verdicts(pd.DataFrame(rows, columns=["side", "framework", "seed", "figure", "value"])).set_index(
        "framework")
    assert table.at["a", "verdict"] == "consistent" and table.at["b", "verdict"] == "not consistent"
    assert table.at["c", "verdict"] == "untested"


def test_throughput_is_judged_as_each_frameworks_share_so_a_uniformly_faster_machine_changes_nothing():
    rows = [(side, fw, seed, tps * (3.0 if side == "rerun" else 1.0))
            for side in ("original", "rerun") for seed in (1, 2, 3)
            for fw, tps in (("verl", 500.0 + seed), ("trl", 7000.0 - seed), ("reference", 11000.0))]
    shares = throughput_shares(pd.DataFrame(rows, columns=["side", "framework", "seed", "tokens_per_s"]))
    table = verdicts(shares).set_index("framework")
    assert (table["verdict"] == "consistent").all() and table["difference"].abs().max() == pytest.approx(0, abs=1e-12)
