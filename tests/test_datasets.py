"""Prompt datasets from a file (task.kind file): JSONL or Parquet, GSM8K and chat records, frozen to the canonical
JSONL; bad records named by file, record and key, nothing half-written; the GSM8K reward; end to end on the CPU."""

import json
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import REPO, snakemake
from harness import HarnessError, reward, task
from harness.config import validate_config

DATA = REPO / "tests" / "fixtures" / "datasets"
GSM8K = {"kind": "file", "path": str(DATA / "gsm8k-sample.jsonl"), "prompt_key": "question", "split_key": "split"}
CHAT = {"kind": "file", "path": str(DATA / "chat-sample.jsonl"), "prompt_key": "messages", "answer_key": None,
        "id_key": "id", "eval_fraction": 0.25}


def frozen(tmp_path, task_config, reward_kind="rule"):
    config = validate_config({"task": task_config, "reward": {"kind": reward_kind}})
    dest = tmp_path / "dataset.jsonl"
    task.write_dataset(config["task"], dest)
    return dest, task.read_dataset(dest)


def test_gsm8k_records_freeze_to_the_canonical_dataset_and_score_by_the_final_number(tmp_path):
    dest, splits = frozen(tmp_path, GSM8K)
    records = [json.loads(line) for line in (DATA / "gsm8k-sample.jsonl").read_text().splitlines()]
    assert len(splits["train"]) == sum(r["split"] == "train" for r in records) == 30
    assert len(splits["eval"]) == 6  # GSM8K's "test" is the eval split
    first = splits["train"][0]
    assert first == {"id": "record-000001", "prompt": records[0]["question"], "answer": records[0]["answer"],
                     "split": "train"}
    assert reward.score(first["prompt"], "22 + 4 = 26\n#### 26", first["answer"]) == 1.0
    assert reward.score(first["prompt"], "#### 25", first["answer"]) == 0.0
    assert reward.score(first["prompt"], "26", first["answer"]) == 0.0  # verl's strict form needs the #### line
    assert reward.correct("so #### 1,026", "x\n#### 1026")
    # The same records from Parquet freeze to the same bytes.
    parquet = tmp_path / "gsm8k.parquet"
    pq.write_table(pa.Table.from_pylist(records), parquet)
    (tmp_path / "from-parquet").mkdir()
    again, _ = frozen(tmp_path / "from-parquet", {**GSM8K, "path": str(parquet)})
    assert again.read_bytes() == dest.read_bytes()


def test_chat_records_without_answers_need_a_reward_model(tmp_path):
    with pytest.raises(HarnessError, match="at task.answer_key: null .* use reward.kind: model"):
        validate_config({"task": CHAT})
    _, splits = frozen(tmp_path, CHAT, reward_kind="model")
    assert len(splits["eval"]) == 6 and len(splits["train"]) == 18  # eval_fraction 0.25 of 24, drawn by task.seed
    row = splits["train"][0]
    assert row["answer"] == "" and row["id"].startswith("chat-") and row["prompt"].endswith(".")


@pytest.mark.parametrize("records, keys, message", [
    ([{"question": "q1", "split": "train"}], {}, r"record 1: missing 'answer'"),
    ([{"question": "q", "answer": "#### 1", "split": "train", "n": "a"},
      {"question": "q", "answer": "#### 2", "split": "eval", "n": "a"}], {"id_key": "n"},
     r"1 duplicate id\(s\) in 'n': a"),
    ([{"question": "q", "answer": "#### 1", "split": "train"}] * 2, {}, r"the eval split is empty \(2 records\)"),
    ([{"question": "q", "answer": "#### 1", "split": "dev"}], {}, r"record 1: split: unknown split 'dev'"),
    ([{"question": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}], "answer": "1",
       "split": "train"}], {}, r"record 1: question: chat messages must be one user turn"),
    ([{"question": "", "answer": "1", "split": "train"}], {}, r"record 1: question: expected a non-empty string"),
])
def test_a_bad_record_is_named_and_nothing_is_written(tmp_path, records, keys, message):
    source = tmp_path / "mine.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in records))
    config = validate_config({"task": {**GSM8K, "path": str(source), **keys}})
    with pytest.raises(HarnessError, match=message) as e:
        task.write_dataset(config["task"], tmp_path / "dataset.jsonl")
    assert str(source) in str(e.value)
    assert not (tmp_path / "dataset.jsonl").exists()


def test_a_line_that_is_not_json_is_named_by_its_line(tmp_path):
    source = tmp_path / "broken.jsonl"
    source.write_text('{"question": "q", "answer": "1", "split": "train"}\n{"question": \n')
    config = validate_config({"task": {**GSM8K, "path": str(source)}})
    with pytest.raises(HarnessError, match=r"broken.jsonl:2: not valid JSON"):
        task.write_dataset(config["task"], tmp_path / "dataset.jsonl")


def test_prompts_longer_than_max_prompt_length_stop_the_policy_build_naming_them(tmp_path):
    from harness.inputs import build_dataset, build_policy

    config = validate_config({"task": GSM8K, "remax": {"max_prompt_length": 24},
                              "policy": {"hidden_size": 16, "intermediate_size": 32, "num_layers": 1, "num_heads": 2,
                                         "sft": {"steps": 1, "batch_size": 4}}})
    build_dataset(config, tmp_path)
    with pytest.raises(HarnessError, match=r"dataset: \d+ prompt\(s\) longer than remax.max_prompt_length = 24 tokens "
                                           r"with this policy's tokenizer: record-000001 \(\d+ tokens\)"):
        build_policy(config, tmp_path)
    assert not (tmp_path / "policy").exists()


@pytest.mark.e2e
def test_a_gsm8k_file_runs_end_to_end_through_the_reference_backend(tmp_path):
    shutil.copy(DATA / "gsm8k-sample.jsonl", tmp_path / "gsm8k.jsonl")
    overrides = tmp_path / "gsm8k.yaml"
    overrides.write_text(
        "task: {kind: file, path: gsm8k.jsonl, prompt_key: question, split_key: split}\n"
        "tokenizer: {vocab_size: 128}\n"
        "remax: {max_prompt_length: 128, max_response_length: 12}\n")
    proc = snakemake(tmp_path, "--cores", "2", "--configfile", REPO / "workflows" / "config" / "micro.yaml", overrides)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = tmp_path / "results"
    frozen_rows = [json.loads(line) for line in (results / "inputs" / "dataset.jsonl").read_text().splitlines()]
    assert len(frozen_rows) == 36 and frozen_rows[0]["answer"].endswith("#### 26")
    manifest = json.loads((results / "runs" / "reference" / "seed1" / "manifest.json").read_text())
    recorded = (results / "inputs" / "dataset.jsonl.sha256").read_text().split()[0]
    assert manifest["inputs"]["dataset"]["sha256"] == recorded
    assert "| reference |" in (results / "report" / "throughput.md").read_text()
