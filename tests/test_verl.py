"""verl adapter: the plan (composed against verl 0.9.1's own packaged hydra config and checked by verl's own
validate_config, in the CPU environment verl-validate), ReMax conformance (verl's own advantage code), and ingest
of the logs verl's own loggers write (tests/fixtures/verl, made by its make_fixtures.py)."""

import json
import math
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys

import pandas as pd
import pytest
import torch
import yaml
from conftest import REPO, run_cli
from reward_inputs import direct_scores, model_reward_inputs, reward_server

from harness import HarnessError, reward
from harness.conformance import CASES, reference_advantages
from harness.frameworks import read_run, reward_serving
from harness.frameworks.verl import VALIDATE_ENV
from harness.frameworks.verl.ingest import ingest
from harness.frameworks.verl.plan import RAW_PROMPT_TEMPLATE, SEED_KEYS, VALIDATION_GENERATIONS, _hydra_value
from harness.inputs import resolve_reward
from harness.results import metrics
from harness.runtime.envs import ensure_env
from harness.runtime.launch_script import shell_command

FIXTURES = REPO / "tests" / "fixtures" / "verl"
RUN = FIXTURES / "run"
EXPECTED = json.loads((FIXTURES / "expected.json").read_text())


# ------------------------------------------------------------------------------------------------------- ingest

@pytest.mark.parametrize("log", ["verl_metrics.jsonl", "console.log"])
def test_ingest_gives_the_numbers_computed_from_the_batches(log):
    df = ingest(read_run("verl", [RUN / log]))
    assert list(df["step"]) == [e["step"] for e in EXPECTED]  # the validation-only record at step 0 is skipped
    assert set(df["framework"]) == {"verl"} and set(df["framework_version"]) == {"0.9.1"}
    assert set(df["run_id"]) == {"verl-a100x8-s1"} and set(df["seed"]) == {1} and set(df["n_gpus"]) == {8}
    for row, exp in zip(df.to_dict("records"), EXPECTED):
        for key in ("time_step_s", "time_gen_s", "time_train_s", "time_transition_s", "response_length_mean"):
            assert row[key] == pytest.approx(exp[key], rel=1e-12), key
        assert row["tokens_prompt"] == pytest.approx(exp["tokens_prompt"], abs=1e-6)
        assert row["tokens_response"] == pytest.approx(exp["tokens_response"], abs=1e-6)
        assert row["reward_mean"] == pytest.approx(exp["reward_mean"], rel=1e-6)
        # Derived from score - reward (float32 in verl): about three significant digits.
        assert row["kl_mean"] == pytest.approx(exp["kl_mean"], rel=1e-3)
        tokens = exp["tokens_prompt"] + exp["tokens_response"]
        assert row["throughput_tok_s"] == pytest.approx(tokens / exp["time_step_s"], rel=1e-12)
        assert row["throughput_tok_s_per_gpu"] == pytest.approx(tokens / exp["time_step_s"] / 8, rel=1e-12)
        # verl's perf/throughput is per GPU; times 8 it is the same aggregate figure.
        assert row["framework_throughput_tok_s"] == pytest.approx(row["throughput_tok_s"], rel=1e-9)
        assert math.isnan(row["tokens_baseline"]) and math.isnan(row["reward_baseline_mean"])
        # from the progress bar in the console (beside the file logger's JSONL): whole seconds after step 1's end
        assert row["time_step_end_s"] == exp["time_step_end_s"]


def test_the_steps_ends_are_the_bars_first_print_of_each_step_and_empty_without_a_console(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(RUN, run)
    console = run / "console.log"
    # tqdm redraws with carriage returns and prints the last count again when the bar closes, later
    console.write_text(console.read_text() + "\rTraining Progress: 100%|██████████| 3/3 [04:31<00:00, 90.33s/it]\n")
    assert list(ingest(read_run("verl", [run / "verl_metrics.jsonl"]))["time_step_end_s"]) == [0, 83, 167]
    console.unlink()
    df = ingest(read_run("verl", [run / "verl_metrics.jsonl"]))
    assert list(df["step"]) == [1, 2, 3] and df["time_step_end_s"].isna().all()


def test_console_and_file_logger_agree_exactly():
    pd.testing.assert_frame_equal(ingest(read_run("verl", [RUN / "console.log"])),
                                  ingest(read_run("verl", [RUN / "verl_metrics.jsonl"])))


def test_ingest_cli_takes_the_run_directory_and_n_gpus(tmp_path):
    out = tmp_path / "m.parquet"
    proc = run_cli("ingest", "verl", RUN, "--n-gpus", "4", "--out", out)
    assert proc.returncode == 0, proc.stderr
    df = pd.read_parquet(out)
    assert list(df["step"]) == [1, 2, 3] and set(df["n_gpus"]) == {4}
    # the framework's per-GPU figure is scaled by the GPUs the caller states
    assert df["framework_throughput_tok_s"].iloc[0] == pytest.approx(df["throughput_tok_s"].iloc[0] / 2)


# The rollout/trainer mismatch (#51). Step records as verl's FileLogger writes them (verl 0.9.1 utils/tracking.py,
# FileLogger.log: orjson.dumps({"step": step, "data": data}) + b"\n", compact, NaN as null): the fixture's own lines
# (made by verl's Tracking, tests/fixtures/verl/make_fixtures.py) with the step's mismatch keys spliced in byte for
# byte: remax_bench/* from the harness's hook (harness/frameworks/verl/inside/remax_bench_verl_mismatch.py) and
# verl's own rollout_corr/kl (trainer/ppo/rollout_corr_helper.py, compute_offpolicy_metrics), next to verl's
# training/rollout_probs_* (utils/debug/metrics.py), which ingest does not read.
MISMATCH_KEYS = {
    1: ('"training/rollout_probs_diff_valid":1,"training/rollout_probs_diff_max":0.0123,'
        '"training/rollout_probs_diff_mean":0.00033,"remax_bench/rollout_logprob_abs_diff_mean":0.0021,'
        '"remax_bench/rollout_token_mult_prob_error":1.0021087,"rollout_corr/kl":-0.0015,'
        '"rollout_corr/k3_kl":1.7e-5,'),
    2: '"remax_bench/rollout_logprob_abs_diff_mean":0.0,"remax_bench/rollout_token_mult_prob_error":null,'
       '"rollout_corr/kl":0.0,',  # null: verl's NaN
    3: "",  # a step without them (a run planned before the hook): the columns are empty
}


def test_ingest_reads_the_rollout_trainer_mismatch_of_each_step(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(RUN, run)
    log = run / "verl_metrics.jsonl"
    lines = log.read_text().splitlines(keepends=True)
    for step, keys in MISMATCH_KEYS.items():
        i = _step_line(lines, step)
        assert lines[i].startswith(f'{{"step":{step},"data":{{')
        lines[i] = lines[i].replace('"data":{', '"data":{' + keys, 1)
    log.write_text("".join(lines))
    df = ingest(read_run("verl", [log])).set_index("step")
    assert df.loc[1, "rollout_logprob_abs_diff_mean"] == 0.0021
    assert df.loc[1, "rollout_token_mult_prob_error"] == 1.0021087
    assert df.loc[1, "rollout_logprob_diff_mean"] == -0.0015  # verl's rollout_corr/kl
    assert df.loc[2, "rollout_logprob_abs_diff_mean"] == 0.0 and df.loc[2, "rollout_logprob_diff_mean"] == 0.0
    assert math.isnan(df.loc[2, "rollout_token_mult_prob_error"])
    assert df.loc[3, list(metrics.MISMATCH)].isna().all()
    # everything else as without the keys
    pd.testing.assert_frame_equal(df.drop(columns=list(metrics.MISMATCH)),
                                  ingest(read_run("verl", [RUN / "verl_metrics.jsonl"])).set_index("step")
                                  .drop(columns=list(metrics.MISMATCH)))
    # and a value that is not a number names the key
    log.write_text(log.read_text().replace('"rollout_corr/kl":-0.0015', '"rollout_corr/kl":"x"'))
    with pytest.raises(HarnessError, match="verl step 1: rollout_corr/kl is 'x', not a number"):
        ingest(read_run("verl", [log]))


def _copy_run(tmp_path, name, edit):
    run = tmp_path / "run"
    shutil.copytree(RUN, run)
    lines = (run / name).read_text().splitlines(keepends=True)
    lineno = edit(lines)
    (run / name).write_text("".join(lines))
    return run / name, lineno


def _step_line(lines, step):
    return next(i for i, line in enumerate(lines) if f"step:{step} - " in line or f'"step":{step},' in line)


def _cut_at(marker, keep):
    def edit(lines):
        i = _step_line(lines, 2)
        lines[i] = lines[i][:lines[i].index(marker) + keep] + "\n"
        return i + 1
    return edit


@pytest.mark.parametrize("name, edit, message", [
    # a line cut inside a key: the last segment has no value
    ("console.log", _cut_at("timing_s/gen", 9), "garbled verl console metric 'timing_s/'"),
    # a line cut inside a value
    ("console.log", _cut_at("np.float64(", 6), "garbled verl console metric value 'np.flo'"),
    # a line cut between metrics: the step lacks what follows
    ("console.log", _cut_at(" - timing_s/gen", 0),
     "verl step 2 lacks timing_s/step, timing_s/gen, timing_s/update_actor, perf/total_num_tokens (truncated log?)"),
    # a line cut before the step counter: still a training record, not a validation pass to skip
    ("console.log", _cut_at(" - actor/reward_kl_penalty:", 0), "verl step 2 lacks training/global_step"),
    ("console.log", _cut_at("step:2", 6), "verl step 2 lacks training/global_step"),
    ("verl_metrics.jsonl", _cut_at('"timing_s/gen"', 5), "not a verl file-logger record"),
])
def test_a_truncated_or_garbled_line_names_file_and_line(tmp_path, name, edit, message):
    log, lineno = _copy_run(tmp_path, name, edit)
    with pytest.raises(HarnessError) as err:
        ingest(read_run("verl", [log]))
    assert f"{log}:{lineno}:" in str(err.value) and message in str(err.value)


def test_a_jsonl_line_that_is_not_a_step_record_names_file_and_line(tmp_path):
    def edit(lines):
        lines.insert(1, '{"data": {}}\n')
        return 2
    log, lineno = _copy_run(tmp_path, "verl_metrics.jsonl", edit)
    with pytest.raises(HarnessError, match=re.escape(f"{log}:{lineno}: expected a verl file-logger record")):
        ingest(read_run("verl", [log]))


def test_a_metric_that_is_not_a_number_names_file_line_and_key(tmp_path):
    def edit(lines):
        i = _step_line(lines, 3)
        lines[i] = lines[i].replace('"timing_s/gen":', '"timing_s/gen":"fast","was":', 1)
        return i + 1
    log, lineno = _copy_run(tmp_path, "verl_metrics.jsonl", edit)
    message = f"{log}:{lineno}: verl step 3: timing_s/gen is 'fast', not a number"
    with pytest.raises(HarnessError, match=re.escape(message)):
        ingest(read_run("verl", [log]))


@pytest.mark.parametrize("name, keep", [
    ("console.log", lambda line: "step:" not in line),  # only the non-metric lines
    ("verl_metrics.jsonl", lambda line: '"step":0,' in line),  # only the validation record
])
def test_a_log_without_training_steps_is_an_error_not_an_empty_table(tmp_path, name, keep):
    def edit(lines):
        lines[:] = [line for line in lines if keep(line)]
    log, _ = _copy_run(tmp_path, name, edit)
    assert log.read_text()  # something is left, just no training step
    with pytest.raises(HarnessError, match="no verl training-step metrics found"):
        ingest(read_run("verl", [log]))


@pytest.mark.parametrize("prefix", ["", "(TaskRunner pid=2861) ", "(pid=17, ip=10.0.0.8) ",
                                    "\x1b[35m(TaskRunner.run pid=2861, ip=10.0.0.7)\x1b[0m "])
def test_console_lines_with_or_without_a_ray_prefix(tmp_path, prefix):
    shutil.copy(RUN / "plan.json", tmp_path / "plan.json")
    line = next(x for x in (RUN / "verl_metrics.jsonl").read_text().splitlines() if '"step":1,' in x)
    data = json.loads(line)["data"]
    (tmp_path / "console.log").write_text("noise\n" + prefix + " - ".join(
        ["step:1"] + [f"{k}:{v!r}" for k, v in data.items() if isinstance(v, (int, float))]) + "\n")
    got = ingest(read_run("verl", [tmp_path / "console.log"]))
    # The step's end comes from verl's progress bar, which this console (one step line) does not print.
    assert got["time_step_end_s"].isna().all()
    end = "time_step_end_s"
    logged = ingest(read_run("verl", [RUN / "verl_metrics.jsonl"]))
    pd.testing.assert_frame_equal(got.drop(columns=end), logged.iloc[:1].drop(columns=end))


def test_identity_comes_from_plan_json_beside_the_log(tmp_path):
    shutil.copy(RUN / "console.log", tmp_path / "console.log")
    with pytest.raises(HarnessError, match=r"no plan\.json beside it"):
        ingest(read_run("verl", [tmp_path / "console.log"]))
    (tmp_path / "plan.json").write_text(json.dumps({"framework": "openrlhf", "framework_version": "x", "run_id": "r",
                                                    "seed": 1, "n_gpus": 8, "samples_per_prompt": 2}))
    with pytest.raises(HarnessError, match="planned for framework 'openrlhf'"):
        ingest(read_run("verl", [tmp_path / "console.log"]))


# --------------------------------------------------------------------------------------------------------- plan

SEED = 3


@pytest.fixture(scope="module")
def planned(a100x8):
    out = a100x8["root"] / "plan"
    proc = run_cli("plan", "verl", "--config", a100x8["config_path"], "--seed", SEED, "--out", out,
                   "--inputs", a100x8["inputs"])
    assert proc.returncode == 0, proc.stderr
    return out


def overrides_of(plan_dir) -> dict:
    argv = json.loads((plan_dir / "plan.json").read_text())["argv"]
    assert argv[1:3] == ["-m", "verl.trainer.main_ppo"]
    return dict(a.split("=", 1) for a in argv[3:])


def test_plan_maps_the_shared_experiment(planned, a100x8):
    plan = json.loads((planned / "plan.json").read_text())
    rc, cfg = a100x8["config"]["remax"], a100x8["config"]
    assert plan["framework"] == "verl" and plan["framework_version"] == "0.9.1" and plan["env"] == "verl"
    assert plan["seed"] == SEED and plan["run_id"] == "verl-a100x8-s3" and plan["n_gpus"] == 8
    assert plan["argv"][0].endswith(".venvs/verl/bin/python")
    o = overrides_of(planned)
    assert o["algorithm.adv_estimator"] == "remax" and o["trainer.use_v1"] == "False"
    assert o["algorithm.use_kl_in_reward"] == "True" and o["algorithm.kl_penalty"] == "kl"
    assert float(o["algorithm.kl_ctrl.kl_coef"]) == rc["kl_coef"]
    assert o["actor_rollout_ref.actor.use_kl_loss"] == "False"
    assert int(o["data.train_batch_size"]) == rc["train_batch_size"]
    assert int(o["actor_rollout_ref.actor.ppo_mini_batch_size"]) == rc["train_batch_size"]
    assert int(o["actor_rollout_ref.rollout.n"]) == rc["rollout_n"]
    assert int(o["data.max_prompt_length"]) == rc["max_prompt_length"]
    assert int(o["data.max_response_length"]) == rc["max_response_length"]
    assert float(o["actor_rollout_ref.actor.optim.lr"]) == rc["lr"]
    assert float(o["actor_rollout_ref.rollout.temperature"]) == rc["temperature"]
    assert float(o["actor_rollout_ref.rollout.top_p"]) == rc["top_p"]
    # The profile's responses run to their full length: verl's ignore_eos, with the way it differs named.
    assert rc["generation_length"] == "fixed" and o["actor_rollout_ref.rollout.ignore_eos"] == "True"
    assert "remax.generation_length" in {d["key"] for d in plan["deviations"]}
    assert int(o["trainer.total_training_steps"]) == rc["steps"]
    assert int(o["trainer.n_gpus_per_node"]) == cfg["launch"]["gpus_per_node"]
    assert int(o["trainer.nnodes"]) == cfg["launch"]["nnodes"]
    assert all(int(o[k]) == SEED for k in SEED_KEYS)
    assert o["trainer.logger"] == "[console,file]"
    # verl's file logger, and the harness's mismatch hook (#51), which verl/__init__.py imports in every process
    inside = REPO / "harness" / "frameworks" / "verl" / "inside"
    assert plan["env_vars"] == {"VERL_FILE_LOGGER_PATH": "$RUN_DIR/verl_metrics.jsonl",
                                "VERL_USE_EXTERNAL_MODULES": "remax_bench_verl_mismatch", "PYTHONPATH": str(inside)}
    assert (inside / "remax_bench_verl_mismatch.py").is_file()
    assert o["actor_rollout_ref.rollout.calculate_log_probs"] == "True"
    assert o["algorithm.rollout_correction.bypass_mode"] == "False"
    bridge = REPO / "harness" / "frameworks" / "verl" / "inside" / "reward_function.py"
    assert o["reward.custom_reward_function.path"] == str(bridge)
    assert o["data.train_files"] == f"[{planned / 'train.parquet'}]"
    shared = {h["key"] for h in plan["hyperparameters"]}
    assert {"remax.steps", "remax.train_batch_size", "remax.rollout_n", "remax.max_prompt_length",
            "remax.max_response_length", "remax.temperature", "remax.top_p", "remax.lr", "remax.kl_coef",
            "remax.grad_clip", "policy.path", "launch.gpus_per_node", "launch.nnodes", "seeds"} <= shared
    for h in plan["hyperparameters"]:  # the table says what the command does
        assert f"{h['framework_key']}={_hydra_value(h['effective'])}" in plan["argv"], h
    assert {d["key"] for d in plan["deviations"]} >= {"throughput tokens"}
    assert set(plan["inputs"]) == {"dataset", "policy", "reward"}
    # The rule scores in verl's own reward workers, as before: no server, verl replaces the shell.
    assert o["reward.custom_reward_function.name"] == "compute_score"
    assert plan["reward"] == {"kind": "rule", "checkpoint": None, "sha256": plan["inputs"]["reward"]["sha256"],
                              "scored_by": "in-process"}
    script = (planned / "launch.sh").read_text()
    assert "serve-reward" not in script and f"exec {shell_command(plan['argv'])}" in script


@pytest.fixture(scope="module")
def model_inputs(tmp_path_factory):
    return model_reward_inputs(tmp_path_factory.mktemp("verl-model"))


@pytest.fixture(scope="module")
def planned_model(model_inputs):
    out = model_inputs["inputs"].parent / "plan"
    proc = run_cli("plan", "verl", "--config", model_inputs["config_path"], "--seed", SEED, "--out", out,
                   "--inputs", model_inputs["inputs"])
    assert proc.returncode == 0, proc.stderr
    return out


def test_plan_with_a_reward_model_serves_the_checkpoint(planned_model, model_inputs):
    plan = json.loads((planned_model / "plan.json").read_text())
    shared = resolve_reward(model_inputs["inputs"])
    assert plan["reward"] == {"kind": "model", "checkpoint": str(model_inputs["inputs"] / "reward" / "model"),
                              "sha256": shared["sha256"], "scored_by": "served"}
    o = overrides_of(planned_model)
    assert o["reward.custom_reward_function.name"] == "compute_score_served"
    assert "reward.reward_model.enable" not in o  # verl's own reward-model engine stays off
    script = (planned_model / "launch.sh").read_text()
    assert subprocess.run(["bash", "-n", planned_model / "launch.sh"]).returncode == 0
    assert (f"serve-reward --host 127.0.0.1 --inputs {model_inputs['inputs']} --device cpu --batch-size 8"
            in script)
    # the EXIT trap stops the server
    assert f"\n{shell_command(plan['argv'])}\n" in script and "exec " not in script
    assert f"export REWARD_URL {reward_serving.URL_VAR}=" in script


STAND_IN_VERL = FIXTURES / "stand_in_job.py"


def test_launch_serves_the_reward_model_to_verl_and_stops_the_server(planned_model, model_inputs, tmp_path):
    """The planned launch.sh, with a stand-in for the GPU environment's python (vLLM and CUDA cannot exist here):
    the server it starts on a free port answers the reward function verl would load, and is gone afterwards."""
    argv0 = json.loads((planned_model / "plan.json").read_text())["argv"][0]
    stand_in = tmp_path / "python"
    stand_in.write_text(f"#!/usr/bin/env bash\nexec {shlex.quote(sys.executable)} {STAND_IN_VERL} \"$@\"\n")
    stand_in.chmod(0o755)
    script = tmp_path / "launch.sh"
    script.write_text((planned_model / "launch.sh").read_text().replace(argv0, str(stand_in)))
    shutil.copy2(planned_model / "plan.json", tmp_path / "plan.json")
    run_dir = tmp_path / "run"
    proc = subprocess.run(["bash", script, run_dir], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = json.loads(next(line[len("STAND-IN "):] for line in proc.stdout.splitlines() if line.startswith("STAND-IN ")))
    assert out["cwd"] == str(run_dir)
    assert [s["score"] for s in out["scores"]] == pytest.approx(
        direct_scores(model_inputs["inputs"], ["12+34="] * 2, ["46", "47"]), rel=1e-5, abs=1e-6)
    assert [s["acc"] for s in out["scores"]] == [1.0, 0.0]  # the task's truth, whatever the reward
    assert "model reward, sha256 " + resolve_reward(model_inputs["inputs"])["sha256"] in \
        (run_dir / "reward_server.log").read_text()
    port = int(out["url"].rsplit(":", 1)[1])
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()


def test_served_reward_function_is_the_reward_servers_answer(model_inputs, tmp_path):
    from harness.frameworks.verl.inside import reward_function as verl_reward

    assert verl_reward.URL_VAR == reward_serving.URL_VAR
    prompts, responses = ["12+34=", "12+34=", "9+9="], ["46", "47", "x"]
    with reward_server(model_inputs["inputs"]) as url:
        os_env = {verl_reward.URL_VAR: url}
        with pytest.MonkeyPatch.context() as mp:
            for k, v in os_env.items():
                mp.setenv(k, v)
            got = [verl_reward.compute_score_served("remax-bench/addition", r, "46", {"prompt": p})
                   for p, r in zip(prompts, responses)]
    assert [g["score"] for g in got] == pytest.approx(
        direct_scores(model_inputs["inputs"], prompts, responses), rel=1e-5, abs=1e-6)
    assert [g["acc"] for g in got] == [1.0, 0.0, 0.0]  # exact match against the ground truth "46"
    with pytest.raises(RuntimeError, match=verl_reward.URL_VAR):
        verl_reward.compute_score_served("remax-bench/addition", "46", "46", {"prompt": "12+34="})


def test_plan_exports_the_dataset_in_verls_parquet_schema(planned, a100x8):
    from harness.inputs import task

    shared = task.read_dataset(a100x8["inputs"] / "dataset.jsonl")
    for name, split in (("train.parquet", "train"), ("val.parquet", "eval")):
        df = pd.read_parquet(planned / name)
        assert list(df.columns) == ["data_source", "prompt", "ability", "reward_model", "extra_info"]
        assert len(df) == len(shared[split])
        first, row = df.iloc[0], shared[split][0]
        assert [dict(m) for m in first["prompt"]] == [{"role": "user", "content": row["prompt"]}]
        assert first["reward_model"] == {"style": "rule", "ground_truth": row["answer"]}
        assert first["extra_info"]["prompt"] == row["prompt"] and first["extra_info"]["id"] == row["id"]
        assert first["data_source"] == "remax-bench/addition"


def test_reward_bridge_is_the_shared_reward():
    from harness.frameworks.verl.inside.reward_function import compute_score

    for response, answer in (("46", "46"), ("4 6", "46"), ("146", "46"), ("47", "46")):
        got = compute_score("remax-bench/addition", response, answer, {"prompt": "12+34=", "num_turns": 2})
        # verl trains on "score" and reports "acc" as its core validation metric: the eval greedy accuracy
        assert got == {"score": reward.score("12+34=", response, answer),
                       "acc": float(reward.correct(response, answer))}
    with pytest.raises(ValueError, match="lacks 'prompt'"):
        compute_score("remax-bench/addition", "46", "46", {})


def test_plan_refuses_a_profile_without_gpus(a100x8, tmp_path):
    raw = yaml.safe_load(a100x8["config_path"].read_text())
    raw["launch"]["gpus_per_node"] = 0
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(raw))
    proc = run_cli("plan", "verl", "--config", tmp_path / "c.yaml", "--seed", 1, "--out", tmp_path / "p",
                   "--inputs", a100x8["inputs"])
    assert proc.returncode == 2 and "launch.gpus_per_node: verl needs GPUs" in proc.stderr
    assert not (tmp_path / "p").exists()


def test_launch_script_is_valid_bash_and_says_how_to_build_the_env(planned, tmp_path):
    script = (planned / "launch.sh").read_text()
    assert subprocess.run(["bash", "-n", planned / "launch.sh"]).returncode == 0
    assert 'export VERL_FILE_LOGGER_PATH="$RUN_DIR"/verl_metrics.jsonl' in script
    if (REPO / ".venvs" / "verl" / "bin" / "python").exists():
        pytest.skip("a verl GPU environment is built here; launching would start a real run")
    proc = subprocess.run(["bash", planned / "launch.sh", tmp_path / "run"], capture_output=True, text=True)
    assert proc.returncode == 2 and "remax-bench env verl" in proc.stderr


# ------------------------------------------------------ verl's own code, in the CPU environment verl-validate

@pytest.fixture(scope="session")
def verl_python():
    """verl 0.9.1 with what composing its config and importing core_algos need; built once into .venvs/."""
    return ensure_env(VALIDATE_ENV)


COMPOSE = FIXTURES / "compose_check.py"  # runs in verl-validate

PROBE = [("12+34=", "46", "46"), ("12+34=", "47", "46"), ("9+9=", "x", "18")]
BAD = {  # appended to the plan's overrides: each must fail in verl's own config or validation
    "misspelled": ("actor_rollout_ref.actor.optim.learning_rate=1e-6",
                   "Could not override 'actor_rollout_ref.actor.optim.learning_rate'"),
    "unknown": ("trainer.use_v2=False", "Could not override 'trainer.use_v2'"),
    "indivisible_batch": ("data.train_batch_size=1020", "must be divisible by minimal possible batch size (8)"),
}


@pytest.fixture(scope="module")
def composed(verl_python, planned, tmp_path_factory):
    """The plan's overrides (and broken variants) composed and validated by verl 0.9.1, in one process."""
    overrides = json.loads((planned / "plan.json").read_text())["argv"][3:]
    jobs = {"plan": {"overrides": overrides, "probe": PROBE},
            **{name: {"overrides": overrides + [bad], "probe": PROBE} for name, (bad, _) in BAD.items()}}
    # From elsewhere, without the harness on the path: verl loads the reward bridge by file path.
    proc = subprocess.run([str(verl_python), COMPOSE, json.dumps(jobs)], capture_output=True, text=True,
                          cwd=tmp_path_factory.mktemp("elsewhere"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


def test_plan_composes_against_verls_packaged_config_and_passes_its_validation(composed, planned):
    out = composed["plan"]
    assert "error" not in out, out.get("error")
    values, o = out["values"], overrides_of(planned)
    lists = {"data.train_files": [str(planned / "train.parquet")], "data.val_files": [str(planned / "val.parquet")],
             "trainer.logger": ["console", "file"],
             "actor_rollout_ref.model.custom_chat_template": RAW_PROMPT_TEMPLATE,
             # quoted for hydra; launch.sh expands the placeholder
             "trainer.validation_data_dir": "$RUN_DIR/" + VALIDATION_GENERATIONS}
    for key, value in o.items():  # every override landed on an existing key, with the value meant
        assert (values[key] == lists[key]) if key in lists else (str(values[key]) == value), key
    assert values["algorithm.adv_estimator"] == "remax" and values["trainer.use_v1"] is False
    # every seed key verl 0.9.1 has carries the run's seed
    assert set(out["seed_keys"]) == set(SEED_KEYS)
    assert all(values[k] == SEED for k in out["seed_keys"])
    assert out["scores"] == [{"score": reward.score(p, r, a), "acc": float(reward.correct(r, a))} for p, r, a in PROBE]
    assert out["rendered"] == "<s>12+34="  # the raw prompt, as the reference backend sees it


def test_model_plan_composes_and_verl_loads_the_served_reward_function(verl_python, planned_model, model_inputs,
                                                                        tmp_path):
    """In verl's own environment: the reward-model plan composes and validates, and the function verl loads from it
    (verl.utils.import_utils.load_extern_object, as reward.py get_custom_reward_fn does) gets the shared server's
    scores of the reward model."""
    overrides = json.loads((planned_model / "plan.json").read_text())["argv"][3:]
    with reward_server(model_inputs["inputs"]) as url:
        proc = subprocess.run([str(verl_python), COMPOSE, json.dumps({"plan": {"overrides": overrides,
                                                                                     "probe": PROBE}})],
                              capture_output=True, text=True, cwd=tmp_path,
                              env={**os.environ, reward_serving.URL_VAR: url})
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.splitlines()[-1])["plan"]
    assert "error" not in out, out.get("error")
    assert out["values"]["reward.custom_reward_function.name"] == "compute_score_served"
    assert out["values"]["reward.reward_model.enable"] is False
    expected = direct_scores(model_inputs["inputs"], [p for p, _, _ in PROBE], [r for _, r, _ in PROBE])
    scores = [s["score"] for s in out["scores"]]
    assert scores == pytest.approx(expected, rel=1e-5, abs=1e-6)
    assert scores != [reward.score(p, r, a) for p, r, a in PROBE]  # the model scored, not the rule
    assert [s["acc"] for s in out["scores"]] == [float(reward.correct(r, a)) for _, r, a in PROBE]


# In verl 0.9.1's own environment, as RayPPOTrainer.fit does it: `import verl` loads the hook the plan names, then
# calculate_debug_metrics (imported at call time) and the rollout correction's metrics on one batch, written by verl's
# own FileLogger; ingest reads the file.
HOOK_PROBE = r"""
import json, sys
import torch
import verl
from verl import DataProto
from verl.utils.debug.metrics import calculate_debug_metrics
from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_add_to_batch
from verl.utils.tracking import FileLogger

job = json.loads(sys.argv[1])
t = {k: torch.tensor(v) for k, v in job["tensors"].items()}
batch = DataProto.from_dict(tensors={"rollout_log_probs": t["rollout"], "old_log_probs": t["trainer"],
                                     "response_mask": t["mask"], "responses": t["responses"],
                                     "attention_mask": torch.cat([torch.ones_like(t["mask"]), t["mask"]], 1)})
metrics = calculate_debug_metrics(batch)
hooked = calculate_debug_metrics.__module__
_, corr = compute_rollout_correction_and_add_to_batch(batch, {"rollout_is": None, "rollout_rs": None})
FileLogger("remax-bench", "probe").log({**job["step"], **metrics, **corr}, step=1)
print(json.dumps({"module": hooked}))
"""


def test_the_mismatch_hook_adds_its_token_means_to_verls_step_metrics(verl_python, tmp_path):
    from harness.frameworks.verl.plan import MISMATCH_ENV

    g = torch.Generator().manual_seed(51)
    trainer = -torch.rand(3, 5, generator=g, dtype=torch.float64) * 4
    rollout = trainer + (torch.rand(3, 5, generator=g, dtype=torch.float64) - 0.5) * 0.2
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 1, 1, 1, 0]])
    rollout[1, 2:] = 0.0  # padding: beyond the mask, never counted
    record = json.loads(next(x for x in (RUN / "verl_metrics.jsonl").read_text().splitlines() if '"step":1,' in x))
    job = {"step": record["data"], "tensors": {"rollout": rollout.float().tolist(), "trainer": trainer.float().tolist(),
                                               "mask": mask.tolist(), "responses": torch.ones(3, 5).long().tolist()}}
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(RUN / "plan.json", run / "plan.json")
    env = {**os.environ, **MISMATCH_ENV, "VERL_FILE_LOGGER_PATH": str(run / "verl_metrics.jsonl")}
    proc = subprocess.run([str(verl_python), "-c", HOOK_PROBE, json.dumps(job)], capture_output=True, text=True,
                          cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.splitlines()[-1])["module"] == MISMATCH_ENV["VERL_USE_EXTERNAL_MODULES"]
    logged = json.loads((run / "verl_metrics.jsonl").read_text())["data"]
    assert logged["training/rollout_probs_diff_valid"] == 1  # verl's own figures are still there
    row = ingest(read_run("verl", [run / "verl_metrics.jsonl"])).iloc[0]
    delta = (rollout.float().double() - trainer.float().double())[mask.bool()]
    assert row["rollout_logprob_abs_diff_mean"] == pytest.approx(delta.abs().mean().item(), rel=1e-12)
    assert row["rollout_token_mult_prob_error"] == pytest.approx(delta.abs().exp().mean().item(), rel=1e-12)
    assert row["rollout_logprob_diff_mean"] == pytest.approx(delta.mean().item(), rel=1e-5)  # verl's, in float32
    assert math.log(row["rollout_token_mult_prob_error"]) >= row["rollout_logprob_abs_diff_mean"] \
        >= abs(row["rollout_logprob_diff_mean"])


@pytest.mark.parametrize("name", list(BAD))
def test_a_key_or_value_verl_does_not_accept_fails(composed, name):
    assert BAD[name][1] in composed[name].get("error", "")


def test_conformance_table(verl_python, tmp_path):
    # through the CLI the `conformance` pipeline target calls: results/conformance.csv, read by the report
    (tmp_path / "c.yaml").write_text("frameworks: [verl]\n")
    proc = run_cli("conformance", "--config", tmp_path / "c.yaml", "--out", tmp_path / "conformance.csv")
    assert proc.returncode == 0, proc.stderr
    table = pd.read_csv(tmp_path / "conformance.csv")
    assert list(table.columns) == ["framework", "case", "max_abs_diff", "verdict", "note", "source"]
    assert set(table["source"]) == {"shared vectors in verl-validate"}  # a GPU profile: the CPU check environment
    rows = table.set_index("case")
    assert set(rows.index) == set(CASES) | {"missing_baseline"}
    for name in CASES:
        assert rows.loc[name, "verdict"] == "match" and rows.loc[name, "max_abs_diff"] <= 1e-6, name
    # dense: how far the per-token advantage moves from the first token's, from the reference's own numbers
    case = CASES["dense"]
    adv, mask = reference_advantages(case), torch.tensor(case["mask"], dtype=torch.float32)
    drift = float(((adv - adv[:, :1]) * mask).abs().max())
    assert drift > 0 and f"{drift:.4g}" in rows.loc["dense", "note"]
    missing = rows.loc["missing_baseline"]
    # verl 0.9.1 refuses a batch without the greedy baselines (a TypeError in its advantage step), as ReMax must
    assert missing["verdict"] == "match" and math.isnan(missing["max_abs_diff"])
    assert "verl raises TypeError" in missing["note"] and "reward_baselines" in missing["note"]


def test_a_two_node_plan_starts_a_ray_cluster_across_the_slurm_allocation_and_the_others_say_why_not(a100x8,
                                                                                                       tmp_path):
    raw = yaml.safe_load(a100x8["config_path"].read_text())
    raw["launch"]["nnodes"] = 2
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(raw))
    proc = run_cli("plan", "verl", "--config", config, "--seed", 1, "--inputs", a100x8["inputs"], "--out",
                   tmp_path / "plan")
    assert proc.returncode == 0, proc.stderr
    plan = json.loads((tmp_path / "plan" / "plan.json").read_text())
    assert {"trainer.nnodes=2", "trainer.n_gpus_per_node=8"} <= set(plan["argv"])
    script = (tmp_path / "plan" / "launch.sh").read_text()
    # the head on the allocation's first node, a worker on the other through srun, the driver pointed at the head
    assert 'scontrol show hostnames "$SLURM_JOB_NODELIST"' in script
    assert re.search(r'srun --nodes=1 --ntasks=1 -w "\$\{RAY_NODES\[0\]\}" \S+/ray start --head .*--num-gpus 8', script)
    assert re.search(r'srun --nodes=1 --ntasks=1 -w "\$node" \S+/ray start --address="\$RAY_HEAD_IP:6379"', script)
    assert script.index('export RAY_ADDRESS="$RAY_HEAD_IP:6379"') < script.index("verl.trainer.main_ppo")
    subprocess.run(["bash", "-n", tmp_path / "plan" / "launch.sh"], check=True)

    from harness.config import load_config
    from harness.frameworks import get_adapter, not_runnable
    two = load_config(config)
    assert not_runnable(get_adapter("verl"), two) is None
    for name in ("reference", "openrlhf", "dschat"):
        assert not_runnable(get_adapter(name), two).startswith("one node only (launch.nnodes is 2): ")
