"""The one config: loaded from YAML, validated against workflows/schemas/config.schema.yaml with each framework's
own block (its folder's config.schema.yaml, harness.frameworks.config_blocks) merged in under its name and its GPU
environment's default image (image.yaml) under container.images, defaults filled.

The Snakefile and every CLI subcommand go through `validate_config`, so a bad key fails the same way
(naming the key) before any job starts.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema

from harness import HarnessError
from harness.frameworks import config_blocks, image_defaults, known_frameworks
from harness.io import bounded_tree, read_document

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

    def whole_string_pattern(validator: Any, pattern: str, instance: object,
                             schema: dict[str, Any]) -> Iterator[jsonschema.ValidationError]:
        # JSON Schema's patterns are ECMA-262 regexes, whose $ matches only at the very end; Python's $ also matches
        # before a final newline, so "micro\n" would pass "^[A-Za-z0-9_.-]+$" and reach a path or a command line.
        if isinstance(instance, str) and not re.search(re.sub(r"(?<!\\)\$$", r"\\Z", pattern), instance):
            yield jsonschema.ValidationError(f"{instance!r} does not match {pattern!r}")

    return jsonschema.validators.extend(validator_class, {"properties": set_defaults,
                                                          "pattern": whole_string_pattern})


_Validator = _with_defaults(jsonschema.Draft202012Validator)


def schema() -> dict:
    """The whole config schema: the shared keys, and each framework's block under its name."""
    merged = read_document(SCHEMA_PATH, "config schema")
    if not isinstance(merged, dict):
        raise HarnessError(f"{SCHEMA_PATH}: the config schema must be a mapping")
    for name, block in config_blocks().items():
        if name in merged["properties"]:
            raise HarnessError(f"framework {name!r}: its config block would replace the shared key {name!r} of "
                               f"{SCHEMA_PATH}; name the framework otherwise")
        merged["properties"][name] = block
    images = merged["properties"]["container"]["properties"]["images"]["properties"]
    for env, image in image_defaults().items():
        images[env] = {"$ref": "#/$defs/image", "default": image}
    return merged


def _where(error: jsonschema.ValidationError) -> str:
    return ".".join(str(p) for p in error.absolute_path) or "(top level)"


MAX_CONFIG_BYTES = 1 << 20  # a profile is a few KB; a larger file is a mistake, not a config
MAX_NODES = 100_000  # keys and items in one config, counted before anything is copied or validated


def _refuse_shared(value: object, source: str) -> None:
    """HarnessError if one mapping or list appears twice in the config (a YAML alias, as Snakemake's own loader
    keeps them) or the config is implausibly large: copying it would expand every alias, and a few hundred bytes of
    nested aliases expand to gigabytes."""
    seen: set[int] = set()
    stack: list[tuple[object, str]] = [(value, "(top level)")]
    nodes = 0
    while stack:
        node, where = stack.pop()
        if not isinstance(node, (dict, list)):
            continue
        if id(node) in seen:
            raise HarnessError(f"{source}: at {where}: a YAML alias (*name) of a block used elsewhere; write the "
                               "block out, aliases are not accepted in a config")
        seen.add(id(node))
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for key, child in items:
            nodes += 1
            if nodes > MAX_NODES:
                raise HarnessError(f"{source}: more than {MAX_NODES} keys and items; not a config")
            stack.append((child, f"{where}.{key}" if where != "(top level)" else str(key)))


def validate_config(config: object, source: str = "config") -> dict:
    """Return a validated copy of `config` with defaults filled; raise HarnessError naming every bad key."""
    if not isinstance(config, dict):
        raise HarnessError(f"{source}: expected a mapping at the top level, got {type(config).__name__}")
    _refuse_shared(config, source)
    bounded_tree(config, source)  # a number that is not finite (.nan, .inf) passes every bound of the schema
    config = dict(json.loads(json.dumps(config)))
    errors = sorted(_Validator(schema()).iter_errors(config), key=lambda e: list(map(str, e.absolute_path)))
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
    not_run = sorted(set(config["reproducibility"]["repeat_seeds"]) - set(config["seeds"]))
    if not_run:
        raise HarnessError(f"{source}: at reproducibility.repeat_seeds: seed(s) {not_run} are not in seeds "
                           f"{config['seeds']}: only a run that exists can be repeated")
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
    """A config file (YAML, or a frozen config.json: YAML 1.1 would read JSON's 1e-06 as a string) through the one
    bounded loader, validated."""
    raw = read_document(path, "config file", max_bytes=MAX_CONFIG_BYTES)
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise HarnessError(f"{path}: expected a mapping at the top level, got {type(raw).__name__}")
    return validate_config(raw, source=str(path))


def refuse_large_files(paths: list) -> None:
    """The size cap of load_config for config files another program parsed (Snakemake's --configfile): it read
    them before the workflow's code runs, so here they are refused after its parse, not before it."""
    for path in paths:
        if Path(path).stat().st_size > MAX_CONFIG_BYTES:
            raise HarnessError(f"{path}: larger than {MAX_CONFIG_BYTES} bytes; not a config")


def arms_from_config(value: object, source: str) -> list[str]:
    """`remax-bench ab`'s arguments for `snakemake ab --config ab='{a: REF, b: REF}'` (optionally `framework: NAME`
    and `a_env`/`b_env`: lists of NAME=FILE): kept out of the experiment's config, so that naming arms reruns nothing
    of the pipeline."""
    keys = {"a": "--a", "b": "--b", "framework": "--framework", "a_env": "--a-env", "b_env": "--b-env"}
    ok = isinstance(value, dict) and {"a", "b"} <= set(value) <= set(keys) and all(
        isinstance(v, str) and v if k in ("a", "b", "framework") else
        isinstance(v, list) and all(isinstance(x, str) and "=" in x for x in v) for k, v in value.items())
    if not ok:
        raise HarnessError(f"{source}: ab must name both arms, and may name the framework and each arm's environment "
                           f"descriptions, e.g. --config ab='{{a: v0.1, b: HEAD}}' or ab='{{a: HEAD, b: HEAD, "
                           f"framework: dschat, b_env: [dschat-cpu=ds-0.19.7.txt]}}' (given: {value!r})")
    assert isinstance(value, dict)
    return [arg for k, v in value.items() for x in (v if isinstance(v, list) else [v]) for arg in (keys[k], x)]
