"""DeepSpeed-Chat adapter: plan, ingest, the launcher's hybrid-engine timing against real DeepSpeed on the CPU,
and (where the pinned liziniu/ReMax checkout is present) ReMax's own parser, trainer step and return computation.

Tests that need the checkout skip without it (CI has no GitHub access): set REMAX_BENCH_REMAX_CHECKOUT to a checkout
of liziniu/ReMax at 536ba49 to run them. The dschat-cpu environment (real DeepSpeed, DS_BUILD_OPS=0) is
built once per machine by harness.runtime.envs.ensure_env.
"""

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import REPO, a100x8_offline, run_cli
from reward_inputs import direct_scores, model_reward_inputs, reward_server

from harness import HarnessError
from harness.config import CONFIG_ROLE, validate_config
from harness.frameworks import get_adapter, read_run
from harness.frameworks.dschat import REMAX_FOLDERS
from harness.frameworks.dschat import conformance as ds_conformance
from harness.frameworks.dschat import ingest as ds_ingest
from harness.frameworks.dschat import plan as ds_plan
from harness.frameworks.registry import PLAN_ROLE
from harness.inputs import resolve_reward
from harness.inputs.policy import train_tokenizer
from harness.inputs.task import DATASET_ROLE, generate, to_jsonl
from harness.io import write_json, write_text
from harness.runtime.envs import ensure_env

FIXTURES = REPO / "tests" / "fixtures" / "dschat"
CHECKOUT = os.environ.get(ds_plan.CHECKOUT_ENV)
needs_checkout = pytest.mark.skipif(
    not (CHECKOUT and (Path(CHECKOUT) / ds_plan.MAIN).is_file()),
    reason=f"no liziniu/ReMax checkout at {ds_plan.REMAX_COMMIT[:7]} ({ds_plan.CHECKOUT_ENV} unset; CI has no GitHub "
           "access): ReMax's own code cannot be imported, so nothing stands in for it")


def small_a100x8(**remax):
    """The 8xA100 profile with a small built policy and a small task (the plan reads sizes, not weights)."""
    config = a100x8_offline(2000, 100)
    config["policy"] = {"hidden_size": 16, "intermediate_size": 32, "num_layers": 1, "num_heads": 2,
                        "sft": {"steps": 0}}
    config["remax"].update({"train_batch_size": 16, "max_prompt_length": 64, "max_response_length": 8, **remax})
    return config


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """Real shared inputs (dataset and a tiny policy) of the small a100x8 config, built by the CLI."""
    d = tmp_path_factory.mktemp("inputs")
    cfg = d / "config.yaml"
    write_text(cfg, yaml.safe_dump(validate_config(small_a100x8())), role=CONFIG_ROLE)
    for what in ("dataset", "policy", "reward"):
        proc = run_cli("inputs", what, "--config", cfg, "--inputs", d / "inputs")
        assert proc.returncode == 0, proc.stderr
    return d / "inputs"


def plan_with(tmp_path, inputs, config, seed=1):
    cfg = tmp_path / "config.yaml"  # YAML: the config loader reads JSON's 1e-06 as a string
    write_text(cfg, yaml.safe_dump(config), role=CONFIG_ROLE)
    return run_cli("plan", "dschat", "--config", cfg, "--seed", seed, "--inputs", inputs, "--out", tmp_path / "plan")


def flag(args, name):
    return args[args.index(name) + 1]


# ---- plan ----------------------------------------------------------------------------------------------------

def test_plan_maps_the_shared_settings_onto_main_py(tmp_path, inputs):
    proc = plan_with(tmp_path, inputs, small_a100x8())
    assert proc.returncode == 0, proc.stderr
    d = tmp_path / "plan"
    p = json.loads((d / "plan.json").read_text())
    assert p["framework"] == "dschat" and p["seed"] == 1 and p["env"] == "dschat" and p["n_gpus"] == 8
    assert p["framework_version"] == "ReMax@536ba49+deepspeed-0.10.3"
    argv = p["argv"]
    assert argv[0].endswith(".venvs/dschat/bin/deepspeed") and flag(argv, "--num_gpus") == "8"
    assert flag(argv, "--greedy-eval") == "off"  # a 7B policy's eval split decoded by Transformers: hours
    assert argv[argv.index("--num_gpus") + 4].endswith("harness/frameworks/dschat/inside/launcher.py")
    assert flag(argv, "--main") == "$RUN_DIR/ReMax/step3_rlhf_finetuning/main.py"
    args = ds_plan.main_args(argv)
    assert args[:2] == ["--algo", "remax"] and flag(args, "--data_path") == "local/jsonfile"
    assert flag(args, "--per_device_generation_batch_size") == "2"  # 16 prompts over 8 GPUs
    assert flag(args, "--max_prompt_seq_len") == "64" and flag(args, "--max_answer_seq_len") == "8"
    assert float(flag(args, "--actor_learning_rate")) == 1e-6 and float(flag(args, "--kl_ctl")) == 0.001
    assert flag(args, "--seed") == "1" and flag(args, "--test_stop_step") == "15"
    assert flag(args, "--output_dir") == "$RUN_DIR/output"
    assert "--enable_hybrid_engine" in args and "--enable_test_mode" in args
    # The actor directory names itself in config.json: DeepSpeed-Chat loads the tokenizer from that name.
    actor = Path(flag(args, "--actor_model_name_or_path"))
    assert actor == d.resolve() / "actor"
    assert json.loads((actor / "config.json").read_text())["_name_or_path"] == str(actor)
    policy = Path(p["inputs"]["policy"]["path"]).resolve()
    assert (actor / "model.safetensors").resolve() == policy / "model.safetensors"
    # local/jsonfile layout: data/train.json and eval.json, JSON lines with prompt/chosen/rejected.
    train = [json.loads(line) for line in (d / "data" / "train.json").read_text().splitlines()]
    dataset = [json.loads(line) for line in Path(p["inputs"]["dataset"]["path"]).read_text().splitlines()]
    assert len(train) == 2000 and set(train[0]) == {"prompt", "chosen", "rejected"}
    assert [(r["prompt"], r["chosen"]) for r in train] == [(r["prompt"], r["answer"]) for r in dataset
                                                           if r["split"] == "train"]
    assert len((d / "data" / "eval.json").read_text().splitlines()) == 100
    # Fairness entries: every mapped shared key, and the deviations of the ReMax code.
    keys = {h["key"] for h in p["hyperparameters"]}
    assert {"remax.steps", "remax.train_batch_size", "remax.lr", "remax.kl_coef", "remax.top_p", "seed"} <= keys
    devs = {d["key"]: d for d in p["deviations"]}
    assert devs["remax.top_p"]["effective"] == 0.9 and devs["remax.top_p"]["shared"] == 1.0
    assert "remax.temperature" not in devs  # the shared 1.0 is DeepSpeed-Chat's hard-coded value
    assert devs["reward.clip"]["effective"] == [-5.0, 5.0] and "KL" in devs["remax.kl_coef"]["cause"]
    assert subprocess.run(["bash", "-n", d / "launch.sh"]).returncode == 0
    # The rule scores inside the launcher, as before: no server, the deepspeed launcher replaces the shell.
    assert p["reward"] == {"kind": "rule", "checkpoint": None, "sha256": p["inputs"]["reward"]["sha256"],
                           "scored_by": "in-process"}
    assert "--reward-url" not in argv and "serve-reward" not in (d / "launch.sh").read_text()


def cpu_config(**remax):
    """The small profile on launch.device cpu, as the cpu-frameworks profile runs DeepSpeed-Chat."""
    config = small_a100x8(**remax)
    config["launch"] = {"device": "cpu", "gpus_per_node": 0, "timeout_min": 10}
    config["dschat"] = {"bf16": False}
    return config


def test_a_cpu_plan_runs_the_cpu_environment_and_states_every_deviation(tmp_path, inputs):
    proc = plan_with(tmp_path, inputs, cpu_config())
    assert proc.returncode == 0, proc.stderr
    p = json.loads((tmp_path / "plan" / "plan.json").read_text())
    assert p["env"] == "dschat-cpu" and p["device"] == "cpu" and p["n_gpus"] == 0
    assert p["framework_version"] == "ReMax@536ba49+deepspeed-0.19.8"
    assert p["argv"][0].endswith(".venvs/dschat-cpu/bin/deepspeed") and flag(p["argv"], "--num_gpus") == "1"
    args = ds_plan.main_args(p["argv"])
    assert flag(args, "--per_device_generation_batch_size") == "16" and "--actor_bf16" in args
    assert p["env_vars"]["DS_ACCELERATOR"] == "cpu" and flag(p["argv"], "--greedy-eval") == "on"
    assert 'DS_ACCELERATOR=cpu' in (tmp_path / "plan" / "launch.sh").read_text()
    devs = {d["key"]: d for d in p["deviations"]}
    assert {"device", "generation", "optimizer", "dschat.bf16", "rollout.short_responses"} <= set(devs)
    assert all(devs[k]["cause"] for k in ("device", "generation", "optimizer", "dschat.bf16"))


def test_plan_with_a_reward_url_records_the_rule_as_served(tmp_path, inputs):
    config = small_a100x8()
    config["dschat"] = {"reward_url": "http://127.0.0.1:18643"}
    assert plan_with(tmp_path, inputs, config).returncode == 0
    p = json.loads((tmp_path / "plan" / "plan.json").read_text())
    assert flag(p["argv"], "--reward-url") == "http://127.0.0.1:18643" and p["reward"]["scored_by"] == "served"
    assert "serve-reward" not in (tmp_path / "plan" / "launch.sh").read_text()  # that server is the user's


@pytest.fixture(scope="module")
def model_inputs(tmp_path_factory):
    return model_reward_inputs(tmp_path_factory.mktemp("dschat-model"))


@pytest.mark.parametrize("reward_url, served_at", [(None, "--host 127.0.0.1"),
                                                   ("http://localhost:18643", "--host localhost")])
def test_plan_with_a_reward_model_serves_it_to_the_launcher(tmp_path, model_inputs, reward_url, served_at):
    config = json.loads(json.dumps(model_inputs["config"]))
    config["dschat"]["reward_url"] = reward_url
    ds_plan.plan(config, 1, tmp_path / "plan", model_inputs["inputs"])
    p = json.loads((tmp_path / "plan" / "plan.json").read_text())
    shared = resolve_reward(model_inputs["inputs"])
    assert p["reward"] == {"kind": "model", "checkpoint": shared["path"], "sha256": shared["sha256"],
                           "scored_by": "served"}
    assert flag(p["argv"], "--reward-url") == "$REWARD_URL" and "$REWARD_URL" in p["argv_note"]
    assert "--reward-url" not in ds_plan.main_args(p["argv"])  # the launcher's option, not main.py's
    script = (tmp_path / "plan" / "launch.sh").read_text()
    assert subprocess.run(["bash", "-n", tmp_path / "plan" / "launch.sh"]).returncode == 0
    assert f"serve-reward {served_at} --inputs {model_inputs['inputs']} --device cpu --batch-size 8" in script
    assert ("REWARD_PORT=18643" in script) == bool(reward_url)
    assert '--reward-url "$REWARD_URL"' in script and "exec " not in script  # the EXIT trap stops the server


def test_plan_refuses_a_reward_url_without_a_port_for_a_reward_model(tmp_path, model_inputs):
    config = json.loads(json.dumps(model_inputs["config"]))
    config["dschat"]["reward_url"] = "http://localhost"
    with pytest.raises(HarnessError, match=r"at dschat\.reward_url: 'http://localhost' names no host and port"):
        ds_plan.plan(config, 1, tmp_path / "plan", model_inputs["inputs"])
    assert not (tmp_path / "plan").exists()


def test_launcher_passes_everything_but_its_own_options_to_main_py():
    from harness.frameworks.dschat.inside import launcher as dschat_launcher

    # the plan reads the launcher's constants from its source, never importing it: the same values
    assert (ds_plan.LAUNCHER_OPTIONS, ds_plan.EVAL_LOG, ds_plan.DETERMINISTIC_ENV) == (
        dschat_launcher.LAUNCHER_OPTIONS, dschat_launcher.EVAL_LOG, dschat_launcher.DETERMINISTIC_ENV)
    # as the deepspeed launcher calls it: script, --local_rank=R, then the planned arguments
    args, rest = dschat_launcher.parse_args(["--local_rank=3", "--main", "m.py", "--steps-log", "s.log",
                                             "--dataset", "d.jsonl", "--data_path", "local/jsonfile", "--seed", "2"])
    assert (args.main, args.steps_log, args.dataset, args.reward_url) == ("m.py", "s.log", "d.jsonl", None)
    assert rest == ["--local_rank=3", "--data_path", "local/jsonfile", "--seed", "2"]


def test_launch_refuses_a_checkout_that_is_not_the_pinned_commit(tmp_path, inputs):
    config = small_a100x8()
    fake = tmp_path / "not-remax"
    subprocess.run(["git", "init", "-q", fake], check=True)
    subprocess.run(["git", "-C", fake, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q",
                    "--allow-empty", "-m", "x"], check=True)
    config["dschat"] = {"checkout": str(fake)}
    assert plan_with(tmp_path, inputs, config).returncode == 0
    run = tmp_path / "run"
    run.mkdir()
    proc = subprocess.run(["bash", tmp_path / "plan" / "launch.sh", run], capture_output=True, text=True)
    assert proc.returncode == 2 and "not the pinned ReMax checkout" in proc.stderr
    assert not (run / "ReMax").exists()


@needs_checkout
def test_an_edited_checkout_at_the_pinned_commit_is_refused(tmp_path, inputs):
    """The fault this guards against: disabling one line of remax_trainer.py (as docs/frameworks-on-cpu.md did to
    find why DeepSpeed-Chat stops learning) leaves HEAD at the pinned commit."""
    copy = tmp_path / "ReMax"
    subprocess.run(["git", "clone", "-q", CHECKOUT, copy], check=True)
    subprocess.run(["git", "-C", copy, "checkout", "-q", ds_plan.REMAX_COMMIT], check=True)
    ds_plan.require_checkout(copy)
    trainer = copy / "step3_rlhf_finetuning" / "remax_trainer.py"
    trainer.write_text(trainer.read_text().replace("if valid_ans_len[i] <= 1:", "if False:"))
    with pytest.raises(HarnessError, match=r"has local changes \(M step3_rlhf_finetuning/remax_trainer.py\)"):
        ds_plan.require_checkout(copy)
    config = small_a100x8()
    config["dschat"] = {"checkout": str(copy)}
    assert plan_with(tmp_path, inputs, config).returncode == 0
    run = tmp_path / "run"
    proc = subprocess.run(["bash", tmp_path / "plan" / "launch.sh", run], capture_output=True, text=True)
    assert proc.returncode == 2, proc.stderr
    assert "has local changes (git status:  M step3_rlhf_finetuning/remax_trainer.py)" in proc.stderr
    assert not (run / "ReMax").exists()


@pytest.mark.parametrize("change, message", [
    ({"remax": {"rollout_n": 4}}, r"remax.rollout_n: 4; DeepSpeed-Chat's ReMax samples one response per prompt"),
    ({"remax": {"train_batch_size": 12}}, r"12 prompts do not divide over 8 GPUs"),
    ({"launch": {"gpus_per_node": 0}},
     r"launch.gpus_per_node: 0; DeepSpeed-Chat needs GPUs unless launch.device is cpu"),
    ({"dschat": {"data_split": "0,1,9"}}, r"evaluation_by_ppl fails on an empty loader"),
])
def test_plan_refuses_settings_the_code_breaks_on(tmp_path, inputs, change, message):
    config = small_a100x8()
    for block, values in change.items():
        config.setdefault(block, {}).update(values)
    with pytest.raises(HarnessError, match=message):
        ds_plan.plan(validate_config(config), 1, tmp_path / "plan", inputs)
    assert not (tmp_path / "plan").exists()


@pytest.mark.parametrize("remax, passes", [
    ({"steps": 60}, 2),  # 50 step-3 batches in one pass over 2,000 prompts: the steps need two
    ({"train_batch_size": 128}, 4),  # 6.25 batches a pass (7 rounded up); main.py divides by zero below 20
])
def test_the_training_split_is_repeated_until_one_epoch_holds_the_steps(tmp_path, inputs, remax, passes):
    assert plan_with(tmp_path, inputs, small_a100x8(**remax)).returncode == 0
    plan = json.loads((tmp_path / "plan" / "plan.json").read_text())
    train = (tmp_path / "plan" / "data" / "train.json").read_text().splitlines()
    assert len(train) == passes * 2000 and train[:2000] == train[2000:4000]
    assert plan["batches_per_epoch"] >= max(plan["hyperparameters"][0]["effective"], ds_plan.MIN_BATCHES)
    assert f"exported {passes} time(s)" in plan["hyperparameters"][0]["framework_key"]


def test_plan_refusal_exits_2_from_the_cli(tmp_path, inputs):
    proc = plan_with(tmp_path, inputs, small_a100x8(rollout_n=4))
    assert proc.returncode == 2 and "samples one response per prompt" in proc.stderr
    assert not (tmp_path / "plan").exists()


def test_split_sizes_follow_data_utils():
    # get_raw_dataset_split_index: cumulative int(round(share * size)), the rounding excess taken off the ends
    assert ds_plan.split_sizes("2,4,4", 2000) == [400, 800, 800]
    # 101: ends 0, 20, 60, 100 -> one short, so every end after the first moves up by one
    assert ds_plan.split_sizes("2,4,4", 101) == [21, 40, 40]
    assert ds_plan.split_sizes("1,1,1", 10) == [4, 3, 3]


# ---- ingest --------------------------------------------------------------------------------------------------

def run_dir(tmp_path, files: dict[str, str], n_gpus=1):
    d = tmp_path / "run"
    d.mkdir()
    write_json(d / "plan.json", {"framework": "dschat", "framework_version": "ReMax@536ba49+deepspeed-0.10.3",
                                 "run_id": "dschat-test-s3", "seed": 3, "n_gpus": n_gpus, "samples_per_prompt": 1},
               role=PLAN_ROLE)
    for name, text in files.items():
        (d / name).write_text(text)  # the framework's logs: not the harness's
    return d


def test_ingest_launcher_lines_with_deepspeed_chats_figure_beside_them(tmp_path):
    d = run_dir(tmp_path, {"console.log": (FIXTURES / "perf_step3_console.txt").read_text(),
                           ds_plan.STEPS_LOG: (FIXTURES / "launcher_steps.jsonl").read_text()})
    out = tmp_path / "m.parquet"
    proc = run_cli("ingest", "dschat", d, "--out", out)
    assert proc.returncode == 0, proc.stderr
    df = pd.read_parquet(out)
    lines = [json.loads(line) for line in (FIXTURES / "launcher_steps.jsonl").read_text().splitlines()]
    assert list(df["step"]) == [r["step"] for r in lines] and set(df["run_id"]) == {"dschat-test-s3"}
    for row, line in zip(df.itertuples(), lines):
        assert row.time_transition_s == pytest.approx(line["time_transition_s"])
        assert row.throughput_tok_s == pytest.approx(
            (line["tokens_prompt"] + line["tokens_response"]) / line["time_step_s"])
        assert not row.tokens_estimated
    # DeepSpeed-Chat's own figure: Samples/sec x Total Seq. Length of the printed line of the same step.
    assert list(df["framework_throughput_tok_s"]) == pytest.approx([19.05 * 72, 20.25 * 72, 19.75 * 72])


def test_ingest_printed_lines_alone_gives_estimated_rows(tmp_path):
    d = run_dir(tmp_path, {"console.log": (FIXTURES / "perf_step3_console.txt").read_text()})
    out = tmp_path / "m.parquet"
    proc = run_cli("ingest", "dschat", d / "console.log", "--out", out, "--n-gpus", "1")
    assert proc.returncode == 0, proc.stderr
    df = pd.read_parquet(out)
    assert list(df["step"]) == [1, 2, 3] and df["tokens_estimated"].all()
    # Batch Size 16, Total Seq. Length 72, Answer Seq. Length 8: tokens at the configured maxima.
    assert list(df["tokens_prompt"]) == [16 * 64] * 3 and list(df["tokens_response"]) == [16 * 8] * 3
    assert list(df["time_step_s"]) == [0.84, 0.79, 0.81] and list(df["time_gen_s"]) == [0.61, 0.58, 0.59]
    assert list(df["time_train_s"]) == [0.23, 0.21, 0.22] and df["time_transition_s"].isna().all()
    assert list(df["reward_mean"]) == [0.3125, 0.375, 0.4375]
    assert list(df["response_length_mean"]) == [6, 6, 5]  # "Average length" counts the last prompt token too
    assert list(df["throughput_tok_s"]) == pytest.approx([16 * 72 / 0.84, 16 * 72 / 0.79, 16 * 72 / 0.81])


@pytest.mark.parametrize("edit, message", [
    (("Training   => Latency: 0.21s", "Training   => Latency: 0.2 1s"), r"console.log:11: garbled"),
    (("Samples/sec: 19.75", "Samples/sec: fast"), r"console.log:16: garbled"),
    (("Generation => Latency: 0.58s", "Generation => Latency: 0.58s, Per-token Latency 72.50 ms"),
     r"console.log:10: garbled"),
])
def test_garbled_printed_lines_name_file_and_line(tmp_path, edit, message):
    text = (FIXTURES / "perf_step3_console.txt").read_text()
    assert edit[0] in text
    d = run_dir(tmp_path, {"console.log": text.replace(edit[0], edit[1], 1)})
    with pytest.raises(HarnessError, match=message):
        ds_ingest.ingest(read_run("dschat", [d / "console.log"]))


def test_garbled_log_exits_2_from_the_cli(tmp_path):
    text = (FIXTURES / "perf_step3_console.txt").read_text().replace("Samples/sec: 19.75", "Samples/sec: fast")
    d = run_dir(tmp_path, {"console.log": text})
    proc = run_cli("ingest", "dschat", d, "--out", tmp_path / "m.parquet")
    assert proc.returncode == 2 and "console.log:16: garbled" in proc.stderr, proc.stderr
    assert not (tmp_path / "m.parquet").exists()


def test_out_of_order_and_json_errors(tmp_path):
    lines = (FIXTURES / "perf_step3_console.txt").read_text().splitlines()
    swapped = lines[:2] + [lines[3], lines[2]] + lines[4:]  # Training before Generation
    swapped_run = run_dir(tmp_path, {"console.log": "\n".join(swapped) + "\n"})
    with pytest.raises(HarnessError, match=r"console.log:3: 'Training   =>' line out of order"):
        ds_ingest.ingest(read_run("dschat", [swapped_run / "console.log"]))
    bad = tmp_path / "b"
    bad.mkdir()
    shutil.copy(tmp_path / "run" / "plan.json", bad / "plan.json")
    (bad / ds_plan.STEPS_LOG).write_text('{"step": 1, "time_step_s": 1.0}\n{"step": 2,\n')
    with pytest.raises(HarnessError, match=r"dschat_steps.log:1: step record lacks tokens_prompt"):
        ds_ingest.ingest(read_run("dschat", [bad / ds_plan.STEPS_LOG]))
    alone = tmp_path / "alone.log"
    alone.write_text((FIXTURES / "perf_step3_console.txt").read_text())
    with pytest.raises(HarnessError, match=r"no plan\.json beside it"):
        ds_ingest.ingest(read_run("dschat", [alone]))


# ---- the launcher against real DeepSpeed on the CPU ----------------------------------------------------------

@pytest.fixture(scope="session")
def ds_python():
    try:
        return ensure_env(ds_plan.CPU_ENV)
    except HarnessError as e:
        pytest.fail(f"building the dschat CPU test environment failed: {e}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ds_env(**extra):
    """One rank of a one-process 'cluster' on the cpu accelerator (what the deepspeed launcher would set)."""
    return {**os.environ, "DS_ACCELERATOR": "cpu", "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1",
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), "PYTHONPATH": "", **extra}


@pytest.fixture(scope="module")
def task_files(tmp_path_factory):
    """A shared dataset (JSONL) and the harness's tokenizer for it, as the launcher reads them."""
    d = tmp_path_factory.mktemp("task")
    rows = generate({"kind": "reverse", "digits": 2, "n_train": 40, "n_eval": 4, "seed": 7})
    write_text(d / "dataset.jsonl", to_jsonl(rows), role=DATASET_ROLE)
    train_tokenizer([r["prompt"] + r["answer"] for r in rows], 64).save_pretrained(d / "tokenizer")
    return d


DRIVER = FIXTURES / "engine_driver.py"  # runs in dschat-cpu


def drive(ds_python, tmp_path, task_files, mode, reward_url="", checkout="", generation_length="natural"):
    log = tmp_path / "steps.log"
    proc = subprocess.run([ds_python, str(DRIVER), ds_plan.LAUNCHER.parent, log, task_files, mode,
                           reward_url, checkout, generation_length], capture_output=True, text=True, env=ds_env(),
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    report = json.loads(next(line[7:] for line in proc.stdout.splitlines() if line.startswith("REPORT ")))
    return report, [json.loads(line) for line in log.read_text().splitlines()]


def _length(row, stop):
    return next((i + 1 for i, t in enumerate(row) if t == stop), len(row))


@pytest.fixture(scope="module")
def engine_run(ds_python, tmp_path_factory, task_files):
    d = tmp_path_factory.mktemp("engine")
    return d, *drive(ds_python, d, task_files, "engine")


def test_hybrid_engine_wrapping_times_real_deepspeed_on_cpu(engine_run, tmp_path, task_files):
    from transformers import AutoTokenizer

    from harness import reward

    engine_dir, report, lines = engine_run
    assert report["engine"] == "DeepSpeedHybridEngine" and report["routed"]
    assert [r["step"] for r in lines] == [1, 2]
    tok = AutoTokenizer.from_pretrained(task_files / "tokenizer")
    answers = {json.loads(x)["prompt"]: json.loads(x)["answer"] for x in (task_files / "dataset.jsonl").open()}
    eos = tok.eos_token_id
    for line, step in zip(lines, report["steps"]):
        width = len(step["prompt"][0])
        sampled = [_length(s[width:], eos) for s in step["sampled"]]
        greedy = [_length(s[width:], eos) for s in step["greedy"]]
        assert line["tokens_prompt"] == sum(map(sum, step["mask"]))
        assert line["tokens_response"] == sum(sampled) and line["tokens_baseline"] == sum(greedy)
        assert line["n_samples"] == 4 and line["response_length_mean"] == sum(sampled) / 4
        prompts = [tok.decode(p, skip_special_tokens=True) for p in step["prompt"]]

        def scores(seqs, lengths, width=width, prompts=prompts):
            return [reward.score(p, tok.decode(s[width:width + n], skip_special_tokens=True), answers[p])
                    for p, s, n in zip(prompts, seqs, lengths)]
        assert line["reward_mean"] == pytest.approx(sum(scores(step["sampled"], sampled)) / 4)
        assert line["reward_baseline_mean"] == pytest.approx(sum(scores(step["greedy"], greedy)) / 4)
        for key in ("time_gen_sampled_s", "time_gen_greedy_s", "time_switch_to_generate_s",
                    "time_switch_to_train_s", "time_train_s", "time_step_s"):
            assert line[key] > 0, key
        assert line["time_gen_s"] == pytest.approx(line["time_gen_sampled_s"] + line["time_gen_greedy_s"])
        assert line["time_transition_s"] == pytest.approx(line["time_switch_to_generate_s"]
                                                          + line["time_switch_to_train_s"])
        parts = line["time_gen_s"] + line["time_transition_s"] + line["time_experience_s"] + line["time_train_s"]
        assert parts == pytest.approx(line["time_step_s"], rel=1e-6)
        assert line["n_gpus"] == 0 and line["world_size"] == 1 and line["kl_mean"] is None
    # ...and they ingest into the common schema.
    d = run_dir(tmp_path, {ds_plan.STEPS_LOG: (engine_dir / "steps.log").read_text()}, n_gpus=0)
    df = ds_ingest.ingest(read_run("dschat", [d / ds_plan.STEPS_LOG]))
    assert list(df["step"]) == [1, 2] and (df["throughput_tok_s"] > 0).all() and df["time_transition_s"].gt(0).all()


def test_fixed_generation_length_holds_every_response_to_max_length(ds_python, tmp_path, task_files, engine_run):
    """remax.generation_length fixed: the launcher's min_length makes Transformers mask EOS in DeepSpeed's generate()
    until max_length, for sampled and greedy calls alike; in natural mode (engine_run) some responses end early."""
    report, lines = drive(ds_python, tmp_path, task_files, "engine", generation_length="fixed")
    _, natural, _ = engine_run
    from transformers import AutoTokenizer

    eos = AutoTokenizer.from_pretrained(task_files / "tokenizer").eos_token_id
    for line, step in zip(lines, report["steps"]):
        width = len(step["prompt"][0])
        for seq in step["sampled"] + step["greedy"]:
            assert len(seq) == width + 6 and eos not in seq[width:]
        assert line["tokens_response"] == line["tokens_baseline"] == 4 * 6
    ended_early = [_length(s[len(st["prompt"][0]):], eos) < 6
                   for st in natural["steps"] for s in st["sampled"] + st["greedy"]]
    assert any(ended_early), "the natural run never stopped at EOS, so it cannot show what fixed changes"


LLAMA_HYBRID_ENGINE = FIXTURES / "llama_hybrid_engine_check.py"  # runs in dschat-cpu; expected to fail


def test_llama_inference_containers_need_gpu_kernels(ds_python, tmp_path):
    """Why the CPU test uses a model without a DeepSpeed inference policy: for a Llama the hybrid engine builds
    DeepSpeedGPTInference layers, whose kernels (InferenceBuilder) have no CPU implementation."""
    proc = subprocess.run([ds_python, str(LLAMA_HYBRID_ENGINE)], capture_output=True, text=True, env=ds_env(),
                          timeout=300)
    assert proc.returncode != 0
    assert "DeepSpeedGPTInference" in proc.stderr and "This op had not been implemented on CPU backend" in proc.stderr


def test_reward_model_served_to_deepspeed_chats_reward_calls(ds_python, engine_run, tmp_path, task_files,
                                                             model_inputs):
    """The launcher's SharedReward (reward_client.py), in the dschat environment under real DeepSpeed, scores the
    engine's sampled and greedy responses through a server on the shared reward model: the model's own scores of
    those texts."""
    from transformers import AutoTokenizer

    with reward_server(model_inputs["inputs"]) as url:
        report, served = drive(ds_python, tmp_path, task_files, "engine", reward_url=url)
    tok = AutoTokenizer.from_pretrained(task_files / "tokenizer")
    for line, step in zip(served, report["steps"]):
        width = len(step["prompt"][0])
        prompts = [tok.decode(p, skip_special_tokens=True) for p in step["prompt"]]
        for key, seqs in (("reward_mean", step["sampled"]), ("reward_baseline_mean", step["greedy"])):
            texts = [tok.decode(s[width:width + _length(s[width:], tok.eos_token_id)], skip_special_tokens=True)
                     for s in seqs]
            expected = direct_scores(model_inputs["inputs"], prompts, texts)
            assert line[key] == pytest.approx(sum(expected) / len(expected), rel=1e-5, abs=1e-6), key
    # Same seed, same responses as the rule run: only the scores differ.
    assert [line["tokens_response"] for line in served] == [line["tokens_response"] for line in engine_run[2]]
    assert [line["reward_mean"] for line in served] != [line["reward_mean"] for line in engine_run[2]]


def test_shared_reward_through_the_reward_server(ds_python, engine_run, tmp_path, task_files):
    from harness.reward.server import RewardServer
    from harness.reward.shared import load_shared_reward

    server = RewardServer("127.0.0.1", 0, load_shared_reward({"kind": "rule"}))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        _, served = drive(ds_python, tmp_path, task_files, "engine", reward_url=server.url)
    finally:
        server.shutdown()
        server.server_close()
    local = engine_run[2]
    # Same seed, same responses: the server's scores equal the in-process reward's.
    assert [(r["reward_mean"], r["reward_baseline_mean"]) for r in served] == \
        [(r["reward_mean"], r["reward_baseline_mean"]) for r in local]


@needs_checkout
def test_remax_trainer_step_through_the_wrapped_engine(ds_python, tmp_path, task_files):
    report, lines = drive(ds_python, tmp_path, task_files, "trainer", checkout=CHECKOUT)
    assert [r["step"] for r in lines] == [1, 2]
    for line, step in zip(lines, report["steps"]):
        assert line["reward_mean"] == pytest.approx(sum(step["rewards"]) / 4)
        assert line["reward_baseline_mean"] == pytest.approx(sum(step["baseline_rewards"]) / 4)
        assert line["kl_mean"] is not None and line["time_transition_s"] > 0 and line["time_gen_greedy_s"] > 0
        assert line["time_experience_s"] > 0  # actor and reference log-probs, and the reward


INSTALL = FIXTURES / "install_check.py"  # runs in dschat-cpu


@needs_checkout
def test_launcher_install_and_the_exported_data_through_deepspeed_chats_reader(ds_python, tmp_path, inputs):
    config = small_a100x8()
    config["dschat"] = {"checkout": CHECKOUT}
    assert plan_with(tmp_path, inputs, config).returncode == 0
    plan = tmp_path / "plan"
    p = json.loads((plan / "plan.json").read_text())
    # the run directory as launch.sh lays it out: the checkout and the plan's data/ side by side
    run = tmp_path / "run"
    run.mkdir()
    (run / "ReMax").symlink_to(CHECKOUT)
    (run / "data").symlink_to(plan / "data")
    (run / "data_files").mkdir()
    actor = flag(ds_plan.main_args(p["argv"]), "--actor_model_name_or_path")
    proc = subprocess.run([ds_python, str(INSTALL), ds_plan.LAUNCHER.parent,
                           run / "ReMax" / ds_plan.MAIN, run, "100", "2,4,4", p["inputs"]["dataset"]["path"], actor],
                          capture_output=True, text=True, env=ds_env(), timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(next(line[7:] for line in proc.stdout.splitlines() if line.startswith("REPORT ")))
    assert out["reward"] == "SharedReward"
    assert out["data_utils"].startswith(str(run / "ReMax"))  # through the link: data/ is found beside it
    # DeepSpeed-Chat's own split of the exported rows is the one plan checks against
    assert out["phase3"] == [ds_plan.split_sizes("2,4,4", 2000)[2], ds_plan.split_sizes("2,4,4", 100)[2]]
    assert out["phase1"][1] == ds_plan.split_sizes("2,4,4", 100)[0]
    # prompts reach the policy as the shared prompt's own tokens (no " " put before them)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(actor)
    prompts = {tuple(tok(json.loads(line)["prompt"])["input_ids"]) for line in (plan / "data" / "train.json").open()}
    assert tuple(out["first_prompt_ids"]) in prompts


# ---- ReMax's own code (pinned checkout) ----------------------------------------------------------------------

@needs_checkout
def test_the_official_remax_code_trains_on_the_cpu_through_plan_launch_and_ingest(ds_python, tmp_path, inputs):
    """main.py --algo remax itself, under the deepspeed launcher on the cpu accelerator, with the launcher's CPU layer:
    every step's line is written and ingested, and DeepSpeed-Chat's own printed figures are kept beside them."""
    config = cpu_config(steps=3, warmup_steps=1, rollout_n=1)
    config["dschat"]["checkout"] = CHECKOUT
    assert plan_with(tmp_path, inputs, config).returncode == 0
    run = tmp_path / "run"
    proc = run_cli("launch", tmp_path / "plan", "--config", tmp_path / "config.yaml", "--out", run,
                   "--timeout-min", 10)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [json.loads(x) for x in (run / ds_plan.STEPS_LOG).read_text().splitlines()]
    assert [x["step"] for x in lines] == [1, 2, 3] and all(x["n_gpus"] == 0 for x in lines)
    assert all(x["n_samples"] == 16 and x["time_train_s"] > 0 and x["time_gen_greedy_s"] > 0 for x in lines)
    df = ds_ingest.ingest(read_run("dschat", [run / ds_plan.STEPS_LOG, run / "console.log"]))
    assert list(df["step"]) == [1, 2, 3] and (df["throughput_tok_s"] > 0).all()
    assert df["framework_throughput_tok_s"].notna().all()  # perf.py's printed lines, parsed from the console
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["environment"]["name"] == "dschat-cpu"
    # Eval greedy accuracy before and after: the launcher's greedy evaluation, made the run's eval.json by launch.
    evaluation = json.loads((run / "eval.json").read_text())
    assert evaluation["run_id"] == "dschat-a100x8-s1" and evaluation["split"] == "eval"
    for point in ("before", "after"):
        assert 0 <= evaluation[point]["greedy_accuracy"] <= 1 and 0 <= evaluation[point]["reward_mean"] <= 1


PARSER = FIXTURES / "parser_check.py"  # runs in dschat-cpu


@needs_checkout
def test_planned_command_passes_main_py_parser(ds_python, tmp_path, inputs):
    assert plan_with(tmp_path, inputs, small_a100x8()).returncode == 0
    argv = json.loads((tmp_path / "plan" / "plan.json").read_text())["argv"]
    main = Path(CHECKOUT) / ds_plan.MAIN

    def parse(args):
        return subprocess.run([ds_python, str(PARSER), main], input=json.dumps(args + ["--local_rank=0"]),
                              capture_output=True, text=True, env=ds_env())
    proc = parse(ds_plan.main_args(argv))
    assert proc.returncode == 0, proc.stderr[-3000:]
    args = json.loads(proc.stdout.strip().splitlines()[-1])
    assert args["algo"] == "remax" and args["data_path"] == ["local/jsonfile"]
    assert args["per_device_generation_batch_size"] == 2 and args["actor_learning_rate"] == 1e-6
    assert args["kl_ctl"] == 0.001 and args["gamma"] == 1.0 and args["seed"] == 1
    assert args["enable_hybrid_engine"] and args["enable_test_mode"] and args["test_stop_step"] == 15
    assert args["lr_scheduler_type"] == "constant" and args["deepspeed"]
    bad = parse(ds_plan.main_args(argv) + ["--not_a_flag_of_main_py", "1"])
    assert bad.returncode != 0 and "unrecognized arguments: --not_a_flag_of_main_py" in bad.stderr


SHORT_RESPONSES = FIXTURES / "short_responses_check.py"  # runs in dschat-cpu


@needs_checkout
def test_short_responses_are_rewritten_before_scoring_and_training(ds_python, task_files):
    """What the rollout.short_responses deviation states, from remax_trainer.py itself: a response of at most one
    non-pad token (an EOS drawn first, or one digit) has its first token replaced by encode(' ')[-1]."""
    proc = subprocess.run([ds_python, str(SHORT_RESPONSES), CHECKOUT, task_files / "tokenizer"],
                          capture_output=True, text=True, env=ds_env(), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    space, eos, digit = got["space"], got["eos"], got["digit"]
    assert got["responses"] == [[space, eos, eos], [space, eos, eos], [digit, digit, eos]]
    assert space not in (eos, digit)


@needs_checkout
def test_conformance_against_remax_compute_loss():
    table = get_adapter("dschat").conformance()
    by_case = table.set_index("case")
    assert list(table.columns) == ["framework", "case", "max_abs_diff", "verdict", "note"]
    assert by_case.loc["outcome", "verdict"] == "match"
    assert by_case.loc["outcome_kl_in_reward", "verdict"] == "differs"
    assert "per-token KL" in by_case.loc["outcome_kl_in_reward", "note"]
    assert by_case.loc["dense", "verdict"] == "differs"
    assert by_case.loc["dschat:reward_beyond_clip", "verdict"] == "differs"
    # outcome: advantage 0.5 - 1.0 on 3 tokens; clipped (8.0 - 0.5) -> 5 shows as a difference of 2.5
    assert by_case.loc["dschat:reward_beyond_clip", "max_abs_diff"] == pytest.approx(2.5)
    assert "clipped to +-5" in by_case.loc["dschat:reward_beyond_clip", "note"]
    assert by_case.loc["outcome@gamma_0.99", "verdict"] == "differs"


def test_the_conformance_command_gives_deepspeed_chat_the_config(tmp_path):
    """dschat.checkout and dschat.gamma come from the config the command is given (a config-less call would read
    the checkout from the environment and check gamma 1 only)."""
    absent = tmp_path / "configured-checkout"
    (tmp_path / "c.yaml").write_text(f"frameworks: [dschat]\ndschat: {{checkout: {absent}, gamma: 0.9}}\n")
    proc = run_cli("conformance", "--config", tmp_path / "c.yaml", "--out", tmp_path / "conformance.csv")
    assert proc.returncode == 0, proc.stderr
    table = pd.read_csv(tmp_path / "conformance.csv")
    assert set(table["verdict"]) == {"not run"} and table["note"].str.contains(str(absent)).all()


def test_conformance_without_checkout_says_not_run(monkeypatch, tmp_path):
    monkeypatch.setenv(ds_plan.CHECKOUT_ENV, str(tmp_path / "absent"))
    table = ds_conformance.conformance()
    assert set(table["verdict"]) == {"not run"} and table["max_abs_diff"].isna().all()
    assert table["note"].str.contains("no ReMax checkout").all()
    assert {"outcome", "outcome_kl_in_reward", "dense"} <= set(table["case"])


@pytest.mark.skipif(not os.environ.get("REMAX_BENCH_REMAX_REPOSITORY"),
                    reason="REMAX_BENCH_REMAX_REPOSITORY unset (a git URL or path holding liziniu/ReMax 536ba49; "
                           "CI has no GitHub access)")
def test_setup_rule_checks_out_the_pinned_commit_shallow_and_sparse(tmp_path):
    snakefile = tmp_path / "Snakefile"
    snakefile.write_text("".join(f'include: "{REPO / "workflows" / "rules" / name}"\n'
                                 for name in ("common.smk", "setup.smk")))
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.run(
        [Path(sys.executable).parent / "snakemake", "results/src/ReMax", "-s", snakefile, "--directory", tmp_path,
         "--cores", "1", "--configfile", REPO / "workflows" / "config" / "cpu.yaml", "--config",
         f'dschat={{"repository": "{os.environ["REMAX_BENCH_REMAX_REPOSITORY"]}"}}'],
        capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    checkout = tmp_path / "results" / "src" / "ReMax"
    git = ["git", "-C", checkout]
    assert subprocess.run(git + ["rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip() \
        == ds_plan.REMAX_COMMIT
    assert subprocess.run(git + ["rev-parse", "--is-shallow-repository"], capture_output=True,
                          text=True).stdout.strip() == "true"
    folders = {p.name for p in checkout.iterdir() if p.is_dir() and p.name != ".git"}
    assert folders == set(REMAX_FOLDERS) and (checkout / ds_plan.MAIN).is_file()
