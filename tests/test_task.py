import hashlib

import pytest

from harness import HarnessError
from harness.inputs.task import generate, read_dataset, to_jsonl, write_dataset

TASK = {"kind": "addition", "digits": 2, "n_train": 300, "n_eval": 50, "seed": 7}


def sha(rows):
    return hashlib.sha256(to_jsonl(rows).encode()).hexdigest()


def test_same_seed_same_bytes_other_seed_other_bytes():
    assert sha(generate(TASK)) == sha(generate(dict(TASK)))
    assert sha(generate(TASK)) != sha(generate({**TASK, "seed": 8}))


def test_rows_are_canonical_and_answers_verify(tmp_path):
    write_dataset(TASK, tmp_path / "d.jsonl")
    splits = read_dataset(tmp_path / "d.jsonl")
    assert (len(splits["train"]), len(splits["eval"])) == (300, 50)
    for row in splits["train"] + splits["eval"]:
        a, b = row["prompt"].rstrip("=").split("+")
        assert int(row["answer"]) == int(a) + int(b)
    train = {r["prompt"] for r in splits["train"]}
    assert not train & {r["prompt"] for r in splits["eval"]}, "a problem is in both splits"
    first = (tmp_path / "d.jsonl").read_text().splitlines()[0]
    assert first.startswith('{"answer":') and " " not in first  # sorted keys, compact separators


def test_reverse_task_answers_are_the_prompt_backwards():
    rows = generate({**TASK, "kind": "reverse", "digits": 3})
    assert all(len(r["prompt"]) == 7 and r["prompt"][:-1][::-1] == r["answer"] for r in rows)
    assert len({r["prompt"] for r in rows}) == len(rows)


def test_too_many_problems_is_an_error():
    with pytest.raises(HarnessError, match="exceeds the 100 distinct addition problems of 1 digits"):
        generate({**TASK, "digits": 1, "n_train": 90, "n_eval": 20})


def test_garbled_line_names_file_and_line(tmp_path):
    path = tmp_path / "d.jsonl"
    write_dataset(TASK, path)
    lines = path.read_text().splitlines()
    lines[4] = lines[4][:-3]
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(HarnessError, match=rf"{path}:5: not valid JSON"):
        read_dataset(path)
