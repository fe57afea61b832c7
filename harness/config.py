"""The one config: loaded from YAML, validated against workflows/schemas/config.schema.yaml, defaults filled.

The Snakefile and every CLI subcommand go through `validate_config`, so a bad key fails the same way
(naming the key) before any job starts.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from harness import HarnessError
from harness.frameworks import known_frameworks

SCHEMA_PATH = Path(__file__).resolve().parents[1] / "workflows" / "schemas" / "config.schema.yaml"


def _with_defaults(validator_class: type[Any]) -> type[Any]:
    validate_properties = validator_class.VALIDATORS["properties"]

    def set_defaults(validator: Any, properties: dict[str, Any], instance: object,
                     schema: dict[str, Any]) -> Iterator[jsonschema.ValidationError]:
        if isinstance(instance, dict):
            for key, sub in properties.items():
                if "default" in sub and key not in instance:
                    instance[key] = json.loads(json.dumps(sub["default"]))
        yield from validate_properties(validator, properties, instance, schema)

    return jsonschema.validators.extend(validator_class, {"properties": set_defaults})


_Validator = _with_defaults(jsonschema.Draft202012Validator)


def _schema() -> dict:
    return yaml.safe_load(SCHEMA_PATH.read_text())


def _where(error: jsonschema.ValidationError) -> str:
    return ".".join(str(p) for p in error.absolute_path) or "(top level)"


def validate_config(config: dict, source: str = "config") -> dict:
    """Return a validated copy of `config` with defaults filled; raise HarnessError naming every bad key."""
    if not isinstance(config, dict):
        raise HarnessError(f"{source}: expected a mapping at the top level, got {type(config).__name__}")
    config = json.loads(json.dumps(config))
    errors = sorted(_Validator(_schema()).iter_errors(config), key=lambda e: list(map(str, e.absolute_path)))
    if errors:
        lines = [f"  at {_where(e)}: {e.message}" for e in errors]
        raise HarnessError(f"{source}: invalid config\n" + "\n".join(lines))
    unknown = [f for f in config["frameworks"] if f not in known_frameworks()]
    if unknown:
        raise HarnessError(
            f"{source}: at frameworks: unknown framework {', '.join(map(repr, unknown))} "
            f"(known: {', '.join(known_frameworks())})"
        )
    if config["remax"]["warmup_steps"] >= config["remax"]["steps"]:
        raise HarnessError(
            f"{source}: at remax.warmup_steps: {config['remax']['warmup_steps']} leaves no measured step "
            f"out of remax.steps={config['remax']['steps']}"
        )
    if config["launch"]["device"] == "cpu" and config["launch"]["nnodes"] != 1:
        raise HarnessError(f"{source}: at launch.nnodes: a CPU run (launch.device cpu) is one machine, "
                           f"not {config['launch']['nnodes']} nodes")
    tc = config["task"]
    if tc["kind"] == "file" and not tc["path"]:
        raise HarnessError(f"{source}: at task.path: task.kind file needs the dataset's path")
    if tc["kind"] == "hub" and not tc["name"]:
        raise HarnessError(f"{source}: at task.name: task.kind hub needs the dataset's name (e.g. openai/gsm8k)")
    if tc["kind"] in ("file", "hub") and tc["answer_key"] is None and config["reward"]["kind"] == "rule":
        raise HarnessError(f"{source}: at task.answer_key: null (no reference answers), but the rule reward scores "
                           "against them; use reward.kind: model for open-ended prompts")
    if config["policy"]["hidden_size"] % config["policy"]["num_heads"]:
        raise HarnessError(f"{source}: at policy.num_heads: must divide policy.hidden_size")
    return config


def load_config(path: str | Path) -> dict:
    path = Path(path)
    try:
        text = path.read_text()
        # YAML 1.1 reads JSON's 1e-06 as a string, so a frozen config.json is read as JSON.
        raw = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except FileNotFoundError:
        raise HarnessError(f"{path}: config file not found") from None
    except json.JSONDecodeError as e:
        raise HarnessError(f"{path}: not valid JSON: {e}") from None
    except yaml.YAMLError as e:
        raise HarnessError(f"{path}: not valid YAML: {e}") from None
    return validate_config(raw if raw is not None else {}, source=str(path))

