"""The one config: loaded from YAML, validated against workflows/schemas/config.schema.yaml with each framework's
own block (its folder's config.schema.yaml, harness.frameworks.config_blocks) merged in under its name and its GPU
environment's default image (image.yaml) under container.images, defaults filled.

The Snakefile and every CLI subcommand go through `validate_config`, so a bad key fails the same way
(naming the key) before any job starts.
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import jsonschema

from harness import HarnessError
from harness.frameworks import config_blocks, image_defaults, known_frameworks
from harness.io import bounded_tree, read_document

SCHEMA_PATH = Path(__file__).resolve().parents[1] / "workflows" / "schemas" / "config.schema.yaml"


_LABEL = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?")
_URL_PATH = re.compile(r"[A-Za-z0-9._~/-]*")
GIT_SCHEMES = ("https", "http", "ssh", "git", "file")


def host_problem(host: str) -> str | None:
    """What keeps `host` from being a hostname or an IPv4 address, or None."""
    labels = host.split(".")
    if all(re.fullmatch(r"[0-9]+", label) for label in labels):  # a name's last label is never all digits
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            return "not a hostname or an IPv4 address"
    elif len(host) > 253 or not all(_LABEL.fullmatch(label) for label in labels):
        return ("not a hostname (letters, digits and hyphens, in labels between dots, none empty or starting or ending "
                "with '-')")
    return None


def url_problem(url: str, schemes: tuple[str, ...] = ("http", "https"), user: tuple[str, ...] = ()) -> str | None:
    """What keeps `url` from being an address the harness may hand on (to a client, git, a launch script), or None:
    a scheme of `schemes`, a hostname or IP literal (IPv6 in brackets), a port of 1-65535, user info only for the
    schemes of `user` and never a password (it would be in every log and plan.json), a plain path, no query."""
    if any(c.isspace() or not c.isprintable() for c in url):
        return "it holds a space or a control character"
    if not url.isascii():
        return "it holds a character that is not ASCII (an international hostname: its xn-- form)"
    try:
        parts = urlsplit(url)
    except ValueError as e:  # Python checks a bracketed host with ipaddress itself
        return f"not a URL ({e})"
    if parts.scheme not in schemes:
        return (f"the scheme must be {' or '.join(schemes) if len(schemes) == 2 else 'one of ' + ', '.join(schemes)}"
                f", not {parts.scheme!r}")
    userinfo, _, hostport = parts.netloc.rpartition("@")
    if userinfo and (parts.scheme not in user or parts.password is not None):
        return "user info (user@ or user:password@) is not accepted here"
    if parts.hostname:
        if hostport.startswith("["):
            try:
                ipaddress.IPv6Address(parts.hostname)
            except ValueError:
                return f"its host [{parts.hostname}] is not an IPv6 address"
        elif problem := host_problem(parts.hostname):
            return f"its host {parts.hostname!r} is {problem}"
    elif parts.scheme != "file":
        return "it names no host"
    try:
        port = parts.port
    except ValueError:  # urlsplit's own check: not a number, or past 65535
        port = 0
    if port == 0:
        return "the port must be a number from 1 to 65535"
    if "?" in url or "#" in url:
        return "a query or a fragment (?... or #...) is not accepted"
    if not _URL_PATH.fullmatch(parts.path):
        return f"the path {parts.path!r} may hold only letters, digits and . _ ~ / -"
    return None


def git_remote_problem(remote: str) -> str | None:
    """What keeps `remote` from being a repository address for `git remote add`: a URL (url_problem, GIT_SCHEMES),
    an scp-like [user@]host:path, or a local path; never a transport helper (NAME::), which runs a program."""
    if re.match(r"[A-Za-z][A-Za-z0-9+.-]*::", remote):
        return "a git transport helper (NAME::ADDRESS) is not accepted"
    if "://" in remote:
        return url_problem(remote, GIT_SCHEMES, user=("ssh",))
    scp = re.fullmatch(r"(?:[A-Za-z0-9._-]+@)?([^/:@]+):.*", remote)  # git's own test: a colon before any slash
    if scp and (problem := host_problem(scp.group(1))):
        return f"its host {scp.group(1)!r} is {problem}"
    return None


# JSON Schema's `format` keyword, asserted: the addresses of the config are parsed, not pattern-matched.
FORMATS: dict[str, tuple[str, Callable[[str], str | None]]] = {
    "http-url": ("a usable http(s) URL", url_problem), "host": ("a usable host", host_problem),
    "git-remote": ("a usable git repository address", git_remote_problem)}


def checked_format(validator: Any, fmt: str, instance: object,
                   schema: dict[str, Any]) -> Iterator[jsonschema.ValidationError]:
    if fmt not in FORMATS:  # a format nothing checks would look like a check
        raise HarnessError(f"{SCHEMA_PATH}: format {fmt!r} is not one harness.config checks ({', '.join(FORMATS)})")
    what, problem_of = FORMATS[fmt]
    if isinstance(instance, str) and (problem := problem_of(instance)):
        yield jsonschema.ValidationError(f"{instance!r} is not {what}: {problem}")


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
                                                          "pattern": whole_string_pattern, "format": checked_format})


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


CONFIG_ROLE = "effective config"  # what `freeze-config` writes (harness.io.WRITTEN): this config, validated
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


def nightly_from_config(value: object, source: str) -> list[str]:
    """`remax-bench nightly`'s options for `snakemake nightly --config nightly='{framework: NAME, budget: MIN,
    bisect_budget: MIN, max_pairs: N}'` (each optional), kept out of the experiment's config like `ab`'s arms."""
    if value is None:
        return []
    keys = {"framework": "--framework", "budget": "--budget", "bisect_budget": "--bisect-budget",
            "max_pairs": "--max-pairs"}
    ok = isinstance(value, dict) and set(value) <= set(keys) and all(
        isinstance(v, str) and v.strip() and not v.startswith("-") if k == "framework" else
        isinstance(v, int) and not isinstance(v, bool) and 3 <= v <= 500 if k == "max_pairs" else
        isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v <= 7 * 24 * 60 for k, v in value.items())
    if not ok:
        raise HarnessError(f"{source}: nightly may name the framework (not empty or starting with '-'), the A/B's "
                           "and the bisection's budgets in minutes (above 0, at most 7 days) and the A/B's most "
                           "pairs (3-500), e.g. --config nightly='{framework: openrlhf, budget: 45, bisect_budget: 90, "
                           f"max_pairs: 15}}' (given: {value!r})")
    assert isinstance(value, dict)
    return [arg for k, v in value.items() for arg in (keys[k], str(v))]


def arms_from_config(value: object, source: str) -> list[str]:
    """`remax-bench ab`'s arguments for `snakemake ab --config ab='{a: REF, b: REF}'` (optionally `framework: NAME`
    and `a_env`/`b_env`: lists of NAME=FILE): kept out of the experiment's config, so that naming arms reruns nothing
    of the pipeline."""
    keys = {"a": "--a", "b": "--b", "framework": "--framework", "a_env": "--a-env", "b_env": "--b-env"}
    ok = isinstance(value, dict) and {"a", "b"} <= set(value) <= set(keys) and all(
        isinstance(v, str) and v.strip() and not v.startswith("-") if k in ("a", "b", "framework") else
        isinstance(v, list) and all(isinstance(x, str) and "=" in x for x in v) for k, v in value.items())
    if not ok:
        raise HarnessError(f"{source}: ab must name both arms, and may name the framework and each arm's environment "
                           f"descriptions (none empty or starting with '-'), e.g. --config ab='{{a: v0.1, b: HEAD}}'"
                           f" or ab='{{a: HEAD, b: HEAD, framework: dschat, b_env: [dschat-cpu=ds-0.19.7.txt]}}' "
                           f"(given: {value!r})")
    assert isinstance(value, dict)
    return [arg for k, v in value.items() for x in (v if isinstance(v, list) else [v]) for arg in (keys[k], x)]
