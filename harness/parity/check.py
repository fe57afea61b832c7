"""`remax-bench parity` for a config: the batch, each framework's update from it (its adapter's driver), the
reference's, and the table of every quantity (TABLE, the report's "Same update?" rows)."""

from __future__ import annotations

from pathlib import Path

from harness import HarnessError
from harness.io import atomic_path
from harness.parity import ACTOR, read_batch, read_update, reference_update, save_update, write_batch
from harness.parity.compare import compare

COLUMNS = ["framework", "quantity", "precision", "value", "expected", "compared_with", "difference", "relative",
           "tolerance", "verdict", "note"]
TABLE = "parity.csv"
UPDATES = "updates"  # each framework's update (the driver's file), and the reference's


def check(config: dict, inputs_dir: str | Path, out_dir: str | Path, frameworks: list[str] | None = None) -> list[dict]:
    """The parity check of every configured framework with a parity driver (or of `frameworks`): the batch, each
    framework's update from it, and the table (TABLE) of every quantity against the reference's, in `out_dir`. A
    framework whose driver fails gets one row, verdict "failed", with the error."""
    from harness.frameworks import get_adapter
    from harness.inputs.policy import load_policy

    # Absolute: the drivers run in the repository (run_driver), not where the rule or the user gave the paths from
    inputs_dir, out_dir = Path(inputs_dir).resolve(), Path(out_dir).resolve()
    names = frameworks or [fw for fw in config["frameworks"] if get_adapter(fw).parity is not None]
    if not names:
        raise HarnessError(f"frameworks: none of {', '.join(config['frameworks'])} has a parity driver "
                           "(Adapter.parity): nothing to compare with the reference")
    for fw in names:
        if get_adapter(fw).parity is None:
            raise HarnessError(f"{fw}: its adapter has no parity driver (Adapter.parity)")
    with atomic_path(out_dir, owner={"kind": "parity check"}) as tmp:
        tmp.mkdir()
        write_batch(config, inputs_dir, tmp / "batch")
        batch, settings = read_batch(tmp / "batch")
        model, _ = load_policy(tmp / "batch" / ACTOR)
        start = {name: p.detach().float().clone() for name, p in model.named_parameters()}
        ref = reference_update(tmp / "batch")
        (tmp / UPDATES).mkdir()
        save_update(ref, tmp / UPDATES / "reference.pt")
        rows: list[dict] = []
        for fw in names:
            out = tmp / UPDATES / f"{fw}.pt"
            try:
                get_adapter(fw).parity(config, tmp / "batch", out)  # type: ignore[misc]
                rows += compare(fw, read_update(out), ref, batch, settings, start)
            except HarnessError as e:
                rows.append({**dict.fromkeys(COLUMNS), "framework": fw, "quantity": "update", "verdict": "failed",
                             "note": str(e)[-2000:]})
        import pandas as pd

        pd.DataFrame(rows, columns=COLUMNS).to_csv(tmp / TABLE, index=False)
    return rows
