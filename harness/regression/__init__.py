"""The nightly check: the append-only results history, its baselines, and the check of the latest pipeline run
against them, with its alerts (docs/regression.md)."""
