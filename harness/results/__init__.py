"""What runs produce, in one schema: the per-step metrics, per-run summaries after warm-up, the efficiency figures,
and the one checker of a JSON record's shape (records.py) (docs/design.md)."""
