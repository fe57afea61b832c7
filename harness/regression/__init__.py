"""Regression alerts: the append-only results history, and the check of the latest run against a baseline
(docs/regression.md)."""
