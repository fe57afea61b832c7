"""What runs produce, in one schema: the per-step metrics, per-run summaries after warm-up, and the efficiency
figures (docs/design.md)."""
