"""Published throughput claims (workflows/report/claims.yaml) set beside this run's measurements, only where the
hardware and the published setting match this run's (docs/report.md)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from harness import HarnessError
from harness.config import validate_config
from harness.io import read_document
from harness.report.runs import Run
from harness.report.tables import config_value, fmt, same_value

# What decides whether a published throughput can be set beside this run's, besides the hardware.
RUN_SETTING = ("remax.max_prompt_length", "remax.max_response_length", "remax.generation_length",
               "remax.train_batch_size", "remax.rollout_n")


def load_claims(path: Path) -> dict:
    claims = read_document(path, "claims file") or {}
    if not isinstance(claims, dict):
        raise HarnessError(f"{path}: a claims file is a mapping of throughput and ratios lists")
    defaults = validate_config({})
    for section, required in (("throughput", ("framework", "tokens_per_s", "hardware", "setting", "source")),
                              ("ratios", ("faster", "slower", "ratio", "hardware", "setting", "source"))):
        entries = claims.get(section, [])
        if not isinstance(entries, list) or not all(isinstance(c, dict) and isinstance(c.get("setting", {}), dict)
                                                    for c in entries):
            raise HarnessError(f"{path}: at {section}: a list of mappings, each with a setting mapping")
        for i, c in enumerate(entries):
            missing = [k for k in required if k not in c]
            if missing:
                raise HarnessError(f"{path}: at {section}[{i}]: missing {', '.join(missing)}")
            unknown = [k for k in c["setting"] if k != "note" and config_value(defaults, k) is None]
            if unknown:
                raise HarnessError(f"{path}: at {section}[{i}].setting: {', '.join(unknown)} is not a config key "
                                   "(a setting is config keys, e.g. remax.max_response_length, and a note)")
    return claims


def run_hardware(runs: list[Run], fw: str) -> list[str] | None:
    """GPU names of the framework's completed runs (from manifest.json), or None when not recorded."""
    seen = [r.manifest["hardware"].get("gpus", []) for r in runs
            if r.framework == fw and r.status == "ok" and r.manifest and "hardware" in r.manifest]
    return seen[0] if seen else None


def _hardware_words(runs: list[Run], fw: str) -> str:
    gpus = run_hardware(runs, fw)
    if gpus is None:
        return "hardware not recorded"
    if not gpus:
        cpu = next(r.manifest["hardware"].get("cpu", "CPU") for r in runs
                   if r.framework == fw and r.manifest and "hardware" in r.manifest)
        return f"0 GPUs ({cpu})"
    names = sorted(set(gpus))
    return f"{len(gpus)}x {' / '.join(names)}"


def _matches(hw: dict, gpus: list[str] | None) -> bool:
    if not gpus:
        return False
    count_ok = hw.get("gpus") is None or len(gpus) == hw["gpus"]
    return count_ok and all(str(hw.get("gpu", "")).lower() in g.lower() for g in gpus)


def setting_words(setting: dict) -> str:
    """A claim's published setting in words: its config keys and values, then its note."""
    keys = "; ".join(f"{k.split('.')[-1]} {fmt(v) if isinstance(v, (int, float)) else v}"
                     for k, v in setting.items() if k != "note")
    return "; ".join(part for part in (keys, setting.get("note", "")) if part) or "not stated"


def run_setting_words(config: dict) -> str:
    """This run's setting (RUN_SETTING) in the words of a claim's."""
    return setting_words({k: config_value(config, k) for k in RUN_SETTING})


def claims_table(claims: dict, runs: list[Run], table: pd.DataFrame, config: dict) -> pd.DataFrame:
    measured = dict(zip(table["framework"], table["tokens_per_s"])) if not table.empty else {}
    rows = []

    def verdict(fws: list[str], hw: dict, setting: dict) -> str | None:
        for fw in fws:
            if fw not in measured:
                return f"not measured: no completed {fw} run"
        for fw in fws:
            if run_hardware(runs, fw) is None:
                return f"not comparable: the hardware of the {fw} runs is not recorded (no manifest.json)"
            if not _matches(hw, run_hardware(runs, fw)):
                return f"not comparable: different hardware (this run: {fw} on {_hardware_words(runs, fw)})"
        if len(fws) > 1 and len({tuple(sorted(run_hardware(runs, fw) or [])) for fw in fws}) > 1:
            return "not comparable: the frameworks ran on different hardware"
        differ = [f"{k} {v} there, {config_value(config, k)} here" for k, v in setting.items()
                  if k != "note" and not same_value(v, config_value(config, k))]
        if differ:
            return f"not comparable: a different setting ({'; '.join(differ)})"
        return None

    def claim_hw(hw: dict) -> str:
        return f"{hw['gpus']}x {hw.get('gpu', '?')}" if hw.get("gpus") else f"{hw.get('gpu', '?')} (count not stated)"

    for c in claims.get("throughput", []):
        fw, why = c["framework"], verdict([c["framework"]], c["hardware"], c["setting"])
        rows.append(dict(claim=f"{fw} {c.get('version') or ''} {fmt(c['tokens_per_s'])} tokens/s".replace("  ", " "),
                         model=c.get("model", ""), hardware=claim_hw(c["hardware"]),
                         setting=setting_words(c["setting"]), source=c["source"],
                         measured=why or f"{fmt(measured[fw])} tokens/s "
                                         f"({measured[fw] / c['tokens_per_s']:.2f}x the claim)",
                         comparable=why is None))
    for c in claims.get("ratios", []):
        fws = [c["faster"], c["slower"]]
        why = verdict(fws, c["hardware"], c["setting"])
        rows.append(dict(claim=f"{c['faster']} / {c['slower']} = {c['ratio']:.2f}x tokens/s", model=c.get("model", ""),
                         hardware=claim_hw(c["hardware"]), setting=setting_words(c["setting"]), source=c["source"],
                         measured=why or f"{measured[fws[0]] / measured[fws[1]]:.2f}x", comparable=why is None))
    return pd.DataFrame(rows, columns=["claim", "model", "hardware", "setting", "source", "measured", "comparable"])
