"""The shared task, written as canonical JSONL (id, prompt, answer, split): generated here, or read from a file.

Generated (`addition`, `reverse`): small enough for a CPU-sized policy to learn within minutes, yet every answer
digit depends on the problem (carries included), so the reward cannot be earned without doing it. From a file
(`file`): a team's own prompts, JSONL or Parquet records (a prompt or one user turn of chat messages, an optional
reference answer, an optional split), checked record by record and frozen to the same canonical JSONL, whose
sha256 every run and every framework's exported copy is traced to.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from harness import HarnessError
from harness.io import read_jsonl, write_text

FIELDS = ("id", "prompt", "answer", "split")


def _addition(i: int, digits: int) -> tuple[str, str]:
    a, b = divmod(i, 10 ** digits)
    return f"{a}+{b}=", str(a + b)


def _reverse(i: int, digits: int) -> tuple[str, str]:
    s = str(i).zfill(2 * digits)
    return f"{s}>", s[::-1]


# kind -> (problem from its index, number of distinct problems for `digits`)
KINDS = {
    "addition": (_addition, lambda digits: 10 ** (2 * digits)),  # a+b=, both operands < 10**digits
    "reverse": (_reverse, lambda digits: 10 ** (2 * digits)),  # a 2*digits-digit string, written backwards
}


def generate(task: dict) -> list[dict]:
    """Distinct problems for train and eval (no problem is in both), identical for identical `task` config."""
    make, space = KINDS[task["kind"]]
    size = space(task["digits"])
    n = task["n_train"] + task["n_eval"]
    if n > size:
        raise HarnessError(f"task: n_train + n_eval = {n} exceeds the {size} distinct {task['kind']} problems "
                           f"of {task['digits']} digits")
    rows = []
    for k, i in enumerate(random.Random(task["seed"]).sample(range(size), n)):
        split = "train" if k < task["n_train"] else "eval"
        prompt, answer = make(i, task["digits"])
        rows.append({"id": f"{split}-{k:06d}", "prompt": prompt, "answer": answer, "split": split})
    return rows


def to_jsonl(rows: list[dict]) -> str:
    return "".join(json.dumps(r, sort_keys=True, separators=(",", ":")) + "\n" for r in rows)


# Split names other datasets use, as the canonical two.
SPLITS = {"train": "train", "eval": "eval", "test": "eval", "validation": "eval"}


def _records(path: Path) -> list[dict]:
    """The file's records: Parquet rows, or one JSON object per JSONL line."""
    if not path.is_file():
        raise HarnessError(f"config: at task.path: {path}: no such file")
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    records = []
    for lineno, record in read_jsonl(path):
        if not isinstance(record, dict):
            raise HarnessError(f"{path}:{lineno}: expected a JSON object per line")
        records.append(record)
    return records


def _prompt(value: object, where: str, key: str) -> str:
    """A prompt string, or the content of chat messages that are one user turn (every framework then renders it
    with the policy's own chat template)."""
    if isinstance(value, str) and value.strip():
        return value
    if isinstance(value, list) and all(isinstance(m, dict) for m in value):
        if len(value) == 1 and value[0].get("role") == "user" and isinstance(value[0].get("content"), str):
            return value[0]["content"]
        raise HarnessError(f"{where}: {key}: chat messages must be one user turn; got roles "
                           f"{[m.get('role') for m in value]} (multi-turn and system prompts are not supported yet)")
    raise HarnessError(f"{where}: {key}: expected a non-empty string or chat messages, got {value!r:.80}")


def from_file(task: dict) -> list[dict]:
    """Canonical rows from task.path, every record checked; errors name the file, the record and the key."""
    path = Path(task["path"])
    records = _records(path)
    splits = None
    if task["split_key"]:
        splits = [_split(record, task["split_key"], f"{path}: record {number}")
                  for number, record in enumerate(records, 1)]
    return canonical(records, splits, task, str(path))


def _split(record: dict, key: str, where: str) -> str:
    if key not in record:
        raise HarnessError(f"{where}: missing {key!r} (task.split_key; it has {', '.join(map(repr, record))})")
    split = SPLITS.get(str(record[key]).lower())
    if split is None:
        raise HarnessError(f"{where}: {key}: unknown split {record[key]!r} (expected {', '.join(SPLITS)})")
    return split


def from_hub(task: dict) -> list[dict]:
    """Canonical rows from a Hugging Face dataset (task.name, subset, revision, splits) through `datasets`, which
    caches what it downloads; a name that is a local folder is read by `datasets` the same way, offline."""
    try:
        import datasets
    except ImportError:
        raise HarnessError("config: at task.kind: hub needs the `datasets` package (pip install -c "
                           "requirements.lock datasets)") from None
    name, where = task["name"], f"dataset {task['name']!r}" + (f" ({task['subset']})" if task["subset"] else "")
    records, splits = [], []
    for split, hub_split in (("train", task["splits"]["train"]), ("eval", task["splits"]["eval"])):
        if hub_split is None:
            continue
        try:
            rows = datasets.load_dataset(name, task["subset"], split=hub_split, revision=task["revision"])
        except datasets.exceptions.DatasetNotFoundError as e:
            raise HarnessError(f"config: at task.name: {where}: no such dataset on the Hub, or not readable "
                               f"with this machine's token ({e})") from None
        except ConnectionError as e:
            raise HarnessError(f"config: at task.name: {where}: the Hugging Face Hub cannot be reached and the "
                               f"dataset is not in the local cache ({e}); run the dataset rule where the Hub is "
                               "reachable (HF_ENDPOINT for a mirror), or give a local file (task.kind file)") from None
        except ValueError as e:  # an unknown split or subset: `datasets` lists the ones there are
            raise HarnessError(f"config: at task.splits.{split}: {where}: {e}") from None
        records += rows.to_list()
        splits += [split] * len(rows)
    return canonical(records, splits if task["splits"]["eval"] is not None else None, task,
                     f"{where} split {task['splits']['train']}")


def canonical(records: list[dict], splits: list[str] | None, task: dict, source: str) -> list[dict]:
    """The shared dataset's rows from a source's records, each checked (errors name the source, the record and the
    key); `splits`, one per record, or None to draw task.eval_fraction of them (task.seed) for eval."""
    if not records:
        raise HarnessError(f"{source}: no records")
    keys = {"prompt": task["prompt_key"], "answer": task["answer_key"], "id": task["id_key"]}
    rows = []
    for number, record in enumerate(records, 1):
        where = f"{source}: record {number}"
        missing = [k for k in keys.values() if k is not None and k not in record]
        if missing:
            raise HarnessError(f"{where}: missing {', '.join(map(repr, missing))} (task.prompt_key, answer_key, "
                               f"id_key, split_key name the columns; it has {', '.join(map(repr, record))})")
        rows.append({"id": str(record[keys["id"]]) if keys["id"] else f"record-{number:06d}",
                     "prompt": _prompt(record[keys["prompt"]], where, keys["prompt"]),
                     "answer": "" if keys["answer"] is None else str(record[keys["answer"]]),
                     "split": splits[number - 1] if splits else "train"})
    seen: dict[str, int] = {}
    for row in rows:
        seen[row["id"]] = seen.get(row["id"], 0) + 1
    duplicates = [i for i, n in seen.items() if n > 1]
    if duplicates:
        raise HarnessError(f"{source}: {len(duplicates)} duplicate id(s) in {keys['id']!r}: "
                           f"{', '.join(duplicates[:5])}{' ...' if len(duplicates) > 5 else ''}")
    if not splits:
        n_eval = max(1, round(len(rows) * task["eval_fraction"]))
        for i in random.Random(task["seed"]).sample(range(len(rows)), n_eval):
            rows[i]["split"] = "eval"
    for split in ("train", "eval"):
        if not any(r["split"] == split for r in rows):
            raise HarnessError(f"{source}: the {split} split is empty ({len(rows)} records)")
    return rows


SOURCES = {"file": from_file, "hub": from_hub}
DATASET_ROLE = "dataset"  # what write_dataset writes (harness.io.WRITTEN)


def write_dataset(task: dict, dest: str | Path) -> None:
    write_text(dest, to_jsonl(SOURCES.get(task["kind"], generate)(task)), role=DATASET_ROLE)


def read_dataset(path: str | Path) -> dict[str, list[dict]]:
    """Rows by split; every line must be a JSON object with exactly the canonical fields."""
    splits: dict[str, list[dict]] = {"train": [], "eval": []}
    for lineno, row in read_jsonl(path):
        if not isinstance(row, dict) or set(row) != set(FIELDS):
            raise HarnessError(f"{path}:{lineno}: expected an object with fields {', '.join(FIELDS)}")
        if row["split"] not in splits:
            raise HarnessError(f"{path}:{lineno}: unknown split {row['split']!r} (expected train or eval)")
        splits[row["split"]].append(row)
    for name, rows in splits.items():
        if not rows:
            raise HarnessError(f"{path}: the {name} split is empty")
    return splits
