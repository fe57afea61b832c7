"""Prompt datasets from a file (task.kind file: JSONL or Parquet) or from the Hugging Face Hub through `datasets`
(task.kind hub), GSM8K and chat records, frozen to the canonical JSONL; bad records named by file, record and key,
an unknown dataset or an unreachable Hub named as such, nothing half-written; the GSM8K reward; end to end on the
CPU."""

import http.server
import json
import os
import shutil
import socket
import subprocess
import threading

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import BIN, REPO, snakemake

from harness import HarnessError, reward
from harness.config import validate_config
from harness.inputs import task
from harness.io import sha256_file

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
    with pytest.raises(HarnessError, match=r"at task\.answer_key: null .* use reward\.kind: model"):
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


def freeze_with_the_cli(tmp_path, task_config, **env):
    """`remax-bench inputs dataset`, as the dataset rule runs it, with its own Hugging Face cache."""
    config = tmp_path / "config.yaml"
    config.write_text(json.dumps({"task": task_config}))
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf-home"), **env}
    return subprocess.run([str(BIN / "remax-bench"), "inputs", "dataset", "--config", str(config), "--inputs",
                           str(tmp_path / "inputs")], capture_output=True, text=True, env=env, timeout=300)


@pytest.fixture
def gsm8k_folder(tmp_path):
    """The GSM8K sample as a dataset folder with train and test files, as `datasets` reads a local dataset."""
    folder = tmp_path / "gsm8k-local"
    folder.mkdir()
    records = [json.loads(line) for line in (DATA / "gsm8k-sample.jsonl").read_text().splitlines()]
    for split, name in (("train", "train"), ("test", "test")):
        (folder / f"{name}.jsonl").write_text("".join(json.dumps({k: v for k, v in r.items() if k != "split"}) + "\n"
                                                      for r in records if r["split"] == split))
    return folder, records


def test_a_dataset_by_name_is_loaded_through_datasets_and_frozen(tmp_path, gsm8k_folder):
    folder, records = gsm8k_folder
    hub = {"kind": "hub", "name": str(folder), "prompt_key": "question", "splits": {"train": "train", "eval": "test"}}
    proc = freeze_with_the_cli(tmp_path, hub)
    assert proc.returncode == 0, proc.stderr
    splits = task.read_dataset(tmp_path / "inputs" / "dataset.jsonl")
    for split, source in (("train", "train"), ("eval", "test")):
        assert [(r["prompt"], r["answer"]) for r in splits[split]] == \
            [(r["question"], r["answer"]) for r in records if r["split"] == source]
    assert (tmp_path / "inputs" / "dataset.jsonl.sha256").read_text().split()[0] == \
        sha256_file(tmp_path / "inputs" / "dataset.jsonl")
    assert any((tmp_path / "hf-home").rglob("*.arrow")), "datasets kept no cache"
    # No eval split named: task.eval_fraction of the train split, as for a file.
    (tmp_path / "again").mkdir()
    proc = freeze_with_the_cli(tmp_path / "again", {**hub, "splits": {"train": "train", "eval": None},
                                                    "eval_fraction": 0.2})
    assert proc.returncode == 0, proc.stderr
    again = task.read_dataset(tmp_path / "again" / "inputs" / "dataset.jsonl")
    assert (len(again["train"]), len(again["eval"])) == (24, 6)


def test_an_unknown_split_is_named_with_the_ones_there_are(tmp_path, gsm8k_folder):
    folder, _ = gsm8k_folder
    proc = freeze_with_the_cli(tmp_path, {"kind": "hub", "name": str(folder), "prompt_key": "question",
                                          "splits": {"train": "train", "eval": "validation"}})
    assert proc.returncode == 2
    assert "at task.splits.eval" in proc.stderr and "validation" in proc.stderr and "test" in proc.stderr
    assert not (tmp_path / "inputs" / "dataset.jsonl").exists()


class HubNotFound(http.server.BaseHTTPRequestHandler):
    """The Hub's answer for a repository that does not exist: 404 with X-Error-Code RepoNotFound (the header
    huggingface_hub's hf_raise_for_status reads); real HTTP, only the Hub's host is stood in for."""

    def _not_found(self):
        body = b'{"error": "Repository not found"}'
        self.send_response(404)
        self.send_header("X-Error-Code", "RepoNotFound")
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_GET = do_HEAD = do_POST = _not_found

    def log_message(self, *args):
        pass


def test_an_unknown_dataset_name_is_named(tmp_path):
    server = http.server.HTTPServer(("127.0.0.1", 0), HubNotFound)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        proc = freeze_with_the_cli(tmp_path, {"kind": "hub", "name": "someone/no-such-dataset", "subset": "main"},
                                   HF_ENDPOINT=f"http://127.0.0.1:{server.server_port}")
    finally:
        server.shutdown()
    assert proc.returncode == 2
    assert "at task.name: dataset 'someone/no-such-dataset' (main): no such dataset on the Hub" in proc.stderr
    assert not (tmp_path / "inputs" / "dataset.jsonl").exists()


def test_an_unreachable_hub_is_named(tmp_path):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = freeze_with_the_cli(tmp_path, {"kind": "hub", "name": "openai/gsm8k", "subset": "main"},
                               HF_ENDPOINT=f"http://127.0.0.1:{port}")
    assert proc.returncode == 2
    assert "at task.name: dataset 'openai/gsm8k' (main): the Hugging Face Hub cannot be reached" in proc.stderr
    assert not (tmp_path / "inputs" / "dataset.jsonl").exists()


def test_a_hub_task_needs_a_name():
    with pytest.raises(HarnessError, match=r"at task\.name: task\.kind hub needs the dataset's name"):
        validate_config({"task": {"kind": "hub"}})


def micro_pipeline_with(tmp_path, overrides: str):
    """`snakemake --cores 2` of the micro profile with these config lines over it; its results and frozen rows."""
    (tmp_path / "overrides.yaml").write_text(overrides + "tokenizer: {vocab_size: 128}\n"
                                             "remax: {max_prompt_length: 128, max_response_length: 12}\n")
    proc = snakemake(tmp_path, "--cores", "2", "--configfile", REPO / "workflows" / "config" / "micro.yaml",
                     tmp_path / "overrides.yaml")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = tmp_path / "results"
    return results, [json.loads(line) for line in (results / "inputs" / "dataset.jsonl").read_text().splitlines()]


@pytest.mark.e2e
def test_a_gsm8k_file_runs_end_to_end_through_the_reference_backend(tmp_path):
    shutil.copy(DATA / "gsm8k-sample.jsonl", tmp_path / "gsm8k.jsonl")
    results, frozen_rows = micro_pipeline_with(
        tmp_path, "task: {kind: file, path: gsm8k.jsonl, prompt_key: question, split_key: split}\n")
    assert len(frozen_rows) == 36 and frozen_rows[0]["answer"].endswith("#### 26")
    manifest = json.loads((results / "runs" / "reference" / "seed1" / "manifest.json").read_text())
    recorded = (results / "inputs" / "dataset.jsonl.sha256").read_text().split()[0]
    assert manifest["inputs"]["dataset"]["sha256"] == recorded
    assert "| reference |" in (results / "report" / "throughput.md").read_text()


@pytest.mark.e2e
def test_chat_prompts_run_end_to_end_scored_by_a_reward_model(tmp_path):
    """Open-ended chat prompts (no answers) through the whole pipeline, the shared reward a reward-model checkpoint."""
    from reward_inputs import save_reward_model

    shutil.copy(DATA / "chat-sample.jsonl", tmp_path / "chat.jsonl")
    records = [json.loads(line) for line in (DATA / "chat-sample.jsonl").read_text().splitlines()]
    save_reward_model(tmp_path / "rm", [r["messages"][0]["content"] for r in records], max_positions=512)
    results, frozen_rows = micro_pipeline_with(
        tmp_path, "task: {kind: file, path: chat.jsonl, prompt_key: messages, answer_key: null, id_key: id, "
        "eval_fraction: 0.25}\n" f"reward: {{kind: model, path: {tmp_path / 'rm'}, device: cpu}}\n")
    assert {r["answer"] for r in frozen_rows} == {""} and len(frozen_rows) == 24
    manifest = json.loads((results / "runs" / "reference" / "seed1" / "manifest.json").read_text())
    assert manifest["inputs"]["reward"]["kind"] == "model"
    steps = pd.read_parquet(results / "metrics" / "reference" / "seed1.parquet")
    # A reward model's scores are real numbers, not the rule's [0, 1] partial credit of an empty answer.
    assert steps["reward_mean"].notna().all() and steps["reward_mean"].nunique() > 1
    assert "| reference |" in (results / "report" / "throughput.md").read_text()
