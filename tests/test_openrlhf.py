"""OpenRLHF adapter: plan (checked by OpenRLHF 0.11.2's own parser), launch lifecycle, ReMax agent and estimator
(run as OpenRLHF's own code in the CPU environment openrlhf-validate), ingest of its per-step log line."""

import importlib.util
import json
import math
import os
import shlex
import shutil
import socket
import subprocess
import sys
import threading

import numpy as np
import pandas as pd
import pytest
from conftest import REPO, run_cli
from reward_inputs import direct_scores, model_reward_inputs

from harness import HarnessError, reward
from harness.conformance import CASES, reference_advantages
from harness.frameworks import get_adapter, read_run
from harness.frameworks.openrlhf import conformance as orl_conformance
from harness.frameworks.openrlhf import ingest as orl_ingest
from harness.frameworks.openrlhf import plan as orl_plan
from harness.inputs import resolve_reward, task
from harness.results import metrics
from harness.reward.server import RewardServer
from harness.reward.shared import load_shared_reward
from harness.runtime import envs
from harness.runtime.launch_script import shell_command

FIXTURES = REPO / "tests" / "fixtures" / "openrlhf"
RUN = FIXTURES / "run"


# ------------------------------------------------------------------------------------------------------- ingest

def test_ingest_fixture_log_gives_independently_computed_numbers():
    df = get_adapter("openrlhf").ingest(read_run("openrlhf", [RUN / "openrlhf.log"]))
    assert list(df["step"]) == [1, 2, 3]
    assert set(df["framework"]) == {"openrlhf"} and set(df["framework_version"]) == {"0.11.2"}
    assert set(df["run_id"]) == {"openrlhf-a100x8-s7"} and set(df["seed"]) == {7} and set(df["n_gpus"]) == {8}
    # By hand from the fixture's lines: 2048 samples per step (1024 prompts x 2), 2 samples per greedy response.
    expected = pd.DataFrame({
        "time_step_s": [41.25 + 88.75 + 6.125 + 52.375, 40.5 + 87.0 + 5.75 + 50.25, 39.75 + 86.5 + 5.5 + 49.0],
        "time_gen_s": [52.375, 50.25, 49.0],
        "time_transition_s": [6.125, 5.75, 5.5],
        "time_train_s": [88.75, 87.0, 86.5],
        "tokens_prompt": [2048 * (20.25 - 6.5), 2048 * (20.0 - 6.25), 2048 * (19.75 - 6.0)],
        "tokens_response": [2048 * 6.5, 2048 * 6.25, 2048 * 6.0],
        "tokens_baseline": [1024 * 7.0, 1024 * 6.5, 1024 * 6.0],
        "reward_mean": [0.4521484375, 0.50390625, 0.5625],
        "reward_baseline_mean": [0.4870849609375, 0.4951171875, 0.53125],
        "kl_mean": [0.0, 0.002675, 0.0072],
        "response_length_mean": [6.5, 6.25, 6.0],
        # the step lines' times, 03:08:00, 03:11:08 and 03:14:11, after the first one
        "time_step_end_s": [0.0, 188.0, 371.0],
    })
    pd.testing.assert_frame_equal(df[list(expected.columns)], expected, check_exact=False, rtol=1e-12)
    assert df["throughput_tok_s"].iloc[0] == pytest.approx((28160 + 13312) / 188.5)
    assert df["throughput_tok_s_per_gpu"].iloc[0] == pytest.approx((28160 + 13312) / 188.5 / 8)


def test_ingest_turns_the_patchs_mismatch_sums_into_the_steps_token_means(tmp_path):
    """remax_patch.py r4's per-sample sums over each step's sample-mean token count (tests/fixtures/openrlhf/README.md,
    run-mismatch/): the rollout/trainer mismatch columns, by hand from the lines; a log without them (an earlier
    revision's, run/) leaves them empty, as does a step whose samples have no response token."""
    df = get_adapter("openrlhf").ingest(read_run("openrlhf", [FIXTURES / "run-mismatch" / "openrlhf.log"]))
    expected = pd.DataFrame({
        "rollout_logprob_abs_diff_mean": [0.0845 / 6.5, 0.0875 / 6.25, 0.06 / 6.0],  # 0.013, 0.014, 0.01
        "rollout_token_mult_prob_error": [6.58515625 / 6.5, 6.3385 / 6.25, 6.0606 / 6.0],
        "rollout_logprob_diff_mean": [-0.0078 / 6.5, 0.01875 / 6.25, -0.006 / 6.0],
    })
    pd.testing.assert_frame_equal(df[list(expected.columns)], expected, check_exact=False, rtol=1e-12)
    for row in df.to_dict("records"):
        assert math.log(row["rollout_token_mult_prob_error"]) >= row["rollout_logprob_abs_diff_mean"] \
            >= abs(row["rollout_logprob_diff_mean"])
    # the rest of the row is the earlier revision's
    before = get_adapter("openrlhf").ingest(read_run("openrlhf", [RUN / "openrlhf.log"]))
    assert before[list(metrics.MISMATCH)].isna().all().all()
    pd.testing.assert_frame_equal(df.drop(columns=list(metrics.MISMATCH)), before.drop(columns=list(metrics.MISMATCH)))
    log = tmp_path / "run" / "openrlhf.log"
    shutil.copytree(FIXTURES / "run-mismatch", log.parent)
    log.write_text(log.read_text(encoding="utf-8").replace("'remax_action_tokens': 6.25", "'remax_action_tokens': 0.0"),
                   encoding="utf-8")
    empty = orl_ingest.ingest(read_run("openrlhf", [log]))[list(metrics.MISMATCH)]
    assert empty.iloc[1].isna().all() and empty.drop(index=1).notna().all().all()


def test_ingest_cli_takes_the_run_directory(tmp_path):
    proc = run_cli("ingest", "openrlhf", RUN, "--out", tmp_path / "m.parquet", "--n-gpus", "16")
    assert proc.returncode == 0, proc.stderr
    df = pd.read_parquet(tmp_path / "m.parquet")
    assert len(df) == 3 and set(df["n_gpus"]) == {16}


def _copy_run(tmp_path, edit):
    """A copy of the fixture run with its log edited; returns the log and the first line the edit changed."""
    run = tmp_path / "run"
    shutil.copytree(RUN, run)
    log = run / "openrlhf.log"
    before = log.read_text(encoding="utf-8")
    log.write_text(edit(before), encoding="utf-8")
    pairs = zip(before.splitlines(), edit(before).splitlines())
    return log, next((i for i, (a, b) in enumerate(pairs, 1) if a != b), None)


@pytest.mark.parametrize("edit, message", [
    (lambda s: s.replace("'timing/step_total': 180.75}", "'timing/step_total': 180.7", 1),
     "garbled OpenRLHF step line"),
    (lambda s: s.replace("✨ Global step 2: {'policy_loss'", "✨ Global step 2: {'policy_loss' 1", 1),
     "the step's metrics are not a Python dict literal"),
    (lambda s: s.replace("✨ Global step 3:", "✨ Global step three:", 1), "garbled OpenRLHF step line"),
])
def test_garbled_step_line_names_file_and_line(tmp_path, edit, message):
    log, lineno = _copy_run(tmp_path, edit)
    with pytest.raises(HarnessError, match=f"{log}:{lineno}: {message}"):
        orl_ingest.ingest(read_run("openrlhf", [log]))


def test_a_run_without_remax_baseline_is_refused(tmp_path):
    log, _ = _copy_run(tmp_path, lambda s: s.replace("'remax_baseline': 0.4951171875, ", ""))
    with pytest.raises(HarnessError, match=r"openrlhf.log:\d+: step 2 lacks remax_baseline \(not a ReMax run"):
        orl_ingest.ingest(read_run("openrlhf", [log]))


def test_the_steps_ends_run_on_over_midnight_and_are_empty_without_the_lines_times(tmp_path):
    times = {"11-30 03:08:00": "12-31 23:54:00", "11-30 03:11:08": "12-31 23:57:08", "11-30 03:14:11": "01-01 00:00:11"}

    def midnight(s):
        for before, after in times.items():
            s = s.replace(f"{before} ppo_trainer.py:551]", f"{after} ppo_trainer.py:551]")
        return s
    log, _ = _copy_run(tmp_path, midnight)
    assert list(orl_ingest.ingest(read_run("openrlhf", [log]))["time_step_end_s"]) == [0.0, 188.0, 371.0]
    log, _ = _copy_run(tmp_path / "bare", lambda s: s.replace(" ppo_trainer.py:551] ✨", " ✨"))
    assert orl_ingest.ingest(read_run("openrlhf", [log]))["time_step_end_s"].isna().all()


def test_nan_in_the_step_dict_is_read_as_nan(tmp_path):
    log, _ = _copy_run(tmp_path, lambda s: s.replace("'remax_kl_sum': 0.0072", "'remax_kl_sum': nan"))
    df = orl_ingest.ingest(read_run("openrlhf", [log]))
    assert math.isnan(df["kl_mean"].iloc[2]) and df["kl_mean"].iloc[1] == 0.002675


def test_identity_comes_from_plan_json_beside_the_log(tmp_path):
    log, _ = _copy_run(tmp_path, lambda s: s)
    (log.parent / "plan.json").unlink()
    with pytest.raises(HarnessError, match=r"no plan\.json beside it"):
        orl_ingest.ingest(read_run("openrlhf", [log]))


def test_ingest_takes_samples_per_prompt_from_the_typed_plan_record_not_the_hyperparameter_table(tmp_path):
    """The samples per prompt (the baseline's tokens) come from plan.json's typed `samples_per_prompt` through the
    run's record: without the hyperparameter table the run ingests the same; with the table saying otherwise it
    still does; without the typed field the CLI exits 2 naming the file and the field."""
    log, _ = _copy_run(tmp_path, lambda s: s)
    plan_path = log.parent / "plan.json"
    plan = json.loads(plan_path.read_text())
    expected = orl_ingest.ingest(read_run("openrlhf", [log]))
    for edited in ({k: v for k, v in plan.items() if k != "hyperparameters"},
                   {**plan, "hyperparameters": [{**plan["hyperparameters"][0], "effective": 7}]}):
        plan_path.write_text(json.dumps(edited))
        pd.testing.assert_frame_equal(orl_ingest.ingest(read_run("openrlhf", [log])), expected)
    plan_path.write_text(json.dumps({**plan, "samples_per_prompt": 4}))
    assert list(orl_ingest.ingest(read_run("openrlhf", [log]))["tokens_baseline"]) == [512 * 7.0, 512 * 6.5, 512 * 6.0]
    plan_path.write_text(json.dumps({k: v for k, v in plan.items() if k != "samples_per_prompt"}))
    proc = run_cli("ingest", "openrlhf", log.parent, "--out", tmp_path / "m.parquet")
    assert proc.returncode == 2 and f"{plan_path}: not a plan.json (missing samples_per_prompt)" in proc.stderr, \
        proc.stderr
    assert not (tmp_path / "m.parquet").exists()


# --------------------------------------------------------------------------------------------------------- plan

@pytest.fixture(scope="module")
def planned(a100x8):
    out = a100x8["root"] / "plan"
    proc = run_cli("plan", "openrlhf", "--config", a100x8["config_path"], "--seed", "3", "--out", out,
                   "--inputs", a100x8["inputs"])
    assert proc.returncode == 0, proc.stderr
    return out


def flag(argv, name, n=1):
    i = argv.index(name)
    return argv[i + 1] if n == 1 else argv[i + 1:i + 1 + n]


def test_plan_maps_the_shared_experiment(planned, a100x8):
    plan = json.loads((planned / "plan.json").read_text())
    rc = a100x8["config"]["remax"]
    assert (plan["framework"], plan["framework_version"], plan["env"], plan["seed"], plan["n_gpus"]) == \
        ("openrlhf", "0.11.2", "openrlhf", 3, 8)
    assert plan["samples_per_prompt"] == rc["rollout_n"]  # write_plan's copy of the config's, which ingest reads
    argv = plan["argv"]
    assert argv[:3] == [str(envs.ENV_ROOT / "openrlhf" / "bin" / "python3"), "-m", "openrlhf.cli.train_ppo_ray"]
    assert flag(argv, "--algo.advantage.estimator") == "remax"
    assert {"--train.colocate_all", "--vllm.enable_sleep", "--ds.enable_sleep"} <= set(argv)
    assert [flag(argv, f) for f in ("--vllm.num_engines", "--actor.num_gpus_per_node", "--ref.num_gpus_per_node")] \
        == ["8", "8", "8"]
    assert flag(argv, "--train.seed") == "3"
    assert flag(argv, "--rollout.batch_size") == str(rc["train_batch_size"])
    assert flag(argv, "--train.batch_size") == str(rc["train_batch_size"] * rc["rollout_n"])
    assert flag(argv, "--rollout.n_samples_per_prompt") == str(rc["rollout_n"])
    assert flag(argv, "--rollout.max_new_tokens") == str(rc["max_response_length"])
    assert flag(argv, "--data.max_len") == str(rc["max_prompt_length"] + rc["max_response_length"])
    assert float(flag(argv, "--actor.adam.lr")) == rc["lr"]
    assert float(flag(argv, "--algo.kl.init_coef")) == rc["kl_coef"]
    assert float(flag(argv, "--rollout.temperature")) == rc["temperature"]
    assert flag(argv, "--train.agent_func_path") == str(planned / "remax_agent.py")
    assert flag(argv, "--data.prompt_dataset") == str(planned / "prompts.jsonl")
    assert (flag(argv, "--data.input_key"), flag(argv, "--data.label_key")) == ("input", "label")
    mapped = {h["key"] for h in plan["hyperparameters"]}
    assert {f"remax.{k}" for k in rc if k != "warmup_steps"} <= mapped and {"seeds", "policy.path"} <= mapped
    assert plan["inputs"]["dataset"]["sha256"] == (a100x8["inputs"] / "dataset.jsonl.sha256").read_text().split()[0]


def test_plan_exports_prompts_agent_and_reward_url(planned, a100x8):
    rc, oc = a100x8["config"]["remax"], a100x8["config"]["openrlhf"]
    rows = [json.loads(line) for line in (planned / "prompts.jsonl").read_text().splitlines()]
    train = task.read_dataset(a100x8["inputs"] / "dataset.jsonl")["train"]
    assert len(rows) == rc["steps"] * rc["train_batch_size"]
    assert rows == [{"input": r["prompt"], "label": r["answer"]} for r in train[:len(rows)]]
    assert (planned / "remax_agent.py").read_bytes() == (orl_plan.REMAX_DIR / "remax_agent.py").read_bytes()
    assert (planned / "remax_patch.py").read_bytes() == (orl_plan.REMAX_DIR / "remax_patch.py").read_bytes()
    agent = json.loads((planned / "remax_agent.json").read_text())
    assert agent["reward_url"] == f"http://127.0.0.1:{oc['reward_port']}/get_reward"
    assert agent["min_tokens_is_max_tokens"] is (rc["generation_length"] == "fixed")
    launch = (planned / "launch.sh").read_text()
    assert subprocess.run(["bash", "-n", str(planned / "launch.sh")]).returncode == 0
    argv = json.loads((planned / "plan.json").read_text())["argv"]
    assert shell_command(argv) + ' 2>&1 | tee "$RUN_DIR/openrlhf.log"' in launch


def test_a_run_longer_than_the_training_split_repeats_it(a100x8, tmp_path):
    """OpenRLHF makes one pass over prompts.jsonl: more steps than the split holds take it again from its start."""
    config = json.loads(json.dumps(a100x8["config"]))
    train = task.read_dataset(a100x8["inputs"] / "dataset.jsonl")["train"]
    config["remax"]["steps"] = 2 * len(train) // config["remax"]["train_batch_size"] + 1
    orl_plan.plan(config, 1, tmp_path / "plan", a100x8["inputs"])
    rows = [json.loads(line) for line in (tmp_path / "plan" / "prompts.jsonl").read_text().splitlines()]
    assert len(rows) == config["remax"]["steps"] * config["remax"]["train_batch_size"] > 2 * len(train)
    assert rows[:len(train)] == rows[len(train):2 * len(train)] == [{"input": r["prompt"], "label": r["answer"]}
                                                                    for r in train]


@pytest.mark.parametrize("change, message", [
    (lambda c: c["launch"].update(gpus_per_node=0), "at launch.gpus_per_node: OpenRLHF needs GPUs"),
    (lambda c: c["launch"].update(nnodes=2), "at launch.nnodes"),
    (lambda c: c["openrlhf"].update(train_micro_batch_size=3), "at openrlhf.train_micro_batch_size"),
])
def test_plan_refuses_what_cannot_run(a100x8, tmp_path, change, message):
    config = json.loads(json.dumps(a100x8["config"]))
    change(config)
    with pytest.raises(HarnessError, match=message):
        orl_plan.plan(config, 1, tmp_path / "plan", a100x8["inputs"])
    assert not (tmp_path / "plan").exists()


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


STAND_IN_JOB = FIXTURES / "stand_in_job.py"


@pytest.mark.parametrize("exit_code", [0, 3])
def test_launch_serves_the_reward_for_the_job_and_stops_it(a100x8, tmp_path, monkeypatch, exit_code):
    """launch.sh with a stand-in for the GPU environment's python (vLLM and CUDA cannot exist here): the stand-in
    job reaches the real reward server started and health-checked by launch.sh; the server is gone afterwards,
    whether the job succeeded or failed."""
    _stand_in_env(tmp_path, monkeypatch)
    config = json.loads(json.dumps(a100x8["config"]))
    port = _free_port()
    config["openrlhf"]["reward_port"] = port
    orl_plan.plan(config, 1, tmp_path / "plan", a100x8["inputs"])
    run_dir = tmp_path / "run"
    proc = subprocess.run(["bash", str(tmp_path / "plan" / "launch.sh"), str(run_dir)], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "STAND_IN_EXIT": str(exit_code)})
    assert proc.returncode == exit_code, proc.stdout + proc.stderr
    log = (run_dir / "openrlhf.log").read_text()
    assert f"stand-in job: reward answer [1.0] in {run_dir}" in log
    assert json.loads((run_dir / "plan.json").read_text())["seed"] == 1
    assert "serving harness.reward.score" in (run_dir / "reward_server.log").read_text()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()


def _stand_in_env(tmp_path, monkeypatch):
    """A stand-in for the GPU environment's python: the patch is a no-op, the OpenRLHF job is STAND_IN_JOB."""
    env_bin = tmp_path / "envs" / "openrlhf" / "bin"
    env_bin.mkdir(parents=True)
    (env_bin / "python3").write_text(f'#!/usr/bin/env bash\ncase "$1" in\n  *remax_patch.py) exit 0 ;;\n'
                                     f'  -m) [ "$2" = openrlhf.cli.train_ppo_ray ] || exit 9; shift 2\n'
                                     f'      exec {shlex.quote(sys.executable)} {STAND_IN_JOB} "$@" ;;\n'
                                     f'esac\nexit 9\n')
    (env_bin / "python3").chmod(0o755)
    monkeypatch.setattr(envs, "ENV_ROOT", tmp_path / "envs")


def test_plan_records_the_rule_reward_as_served(planned):
    plan = json.loads((planned / "plan.json").read_text())
    assert plan["reward"] == {"kind": "rule", "checkpoint": None, "sha256": plan["inputs"]["reward"]["sha256"],
                              "scored_by": "served"}
    assert "--inputs" not in (planned / "launch.sh").read_text()  # the rule server, as before


@pytest.fixture(scope="module")
def model_inputs(tmp_path_factory):
    return model_reward_inputs(tmp_path_factory.mktemp("openrlhf-model"))


def test_launch_serves_the_reward_model_for_the_job(model_inputs, tmp_path, monkeypatch):
    """With reward.kind model, launch.sh serves the shared checkpoint (serve-reward --inputs), checks that the
    server answering is the one it started and that it serves the planned sha256, and the job's reward request is
    answered with the reward model's score."""
    _stand_in_env(tmp_path, monkeypatch)
    config = json.loads(json.dumps(model_inputs["config"]))
    port = _free_port()
    config["openrlhf"]["reward_port"] = port
    orl_plan.plan(config, 1, tmp_path / "plan", model_inputs["inputs"])
    plan = json.loads((tmp_path / "plan" / "plan.json").read_text())
    shared = resolve_reward(model_inputs["inputs"])
    assert plan["reward"] == {"kind": "model", "checkpoint": shared["path"], "sha256": shared["sha256"],
                              "scored_by": "served"}
    script = (tmp_path / "plan" / "launch.sh").read_text()
    assert f"--inputs {model_inputs['inputs']} --device cpu --batch-size 8 --max-length 1024" in script
    run_dir = tmp_path / "run"
    proc = subprocess.run(["bash", str(tmp_path / "plan" / "launch.sh"), str(run_dir)], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    answer = json.loads((run_dir / "openrlhf.log").read_text().split("reward answer ")[1].split(" in ")[0])
    assert answer == pytest.approx(direct_scores(model_inputs["inputs"], ["12+34="], ["46"]), rel=1e-5, abs=1e-6)
    assert answer != [1.0]  # the model scored, not the rule
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()


def test_launch_refuses_a_server_that_is_not_its_own(a100x8, tmp_path, monkeypatch):
    """A reward server already on the planned port (another run's): launch.sh's server cannot listen, and the job
    does not run against the stranger."""
    _stand_in_env(tmp_path, monkeypatch)
    stranger = RewardServer("127.0.0.1", 0, load_shared_reward({"kind": "rule"}))
    threading.Thread(target=stranger.serve_forever, daemon=True).start()
    try:
        config = json.loads(json.dumps(a100x8["config"]))
        config["openrlhf"]["reward_port"] = stranger.server_address[1]
        orl_plan.plan(config, 1, tmp_path / "plan", a100x8["inputs"])
        proc = subprocess.run(["bash", str(tmp_path / "plan" / "launch.sh"), str(tmp_path / "run")],
                              capture_output=True, text=True, timeout=120)
    finally:
        stranger.shutdown()
        stranger.server_close()
    assert proc.returncode == 2 and "a reward server already answers at" in proc.stderr
    assert not (tmp_path / "run" / "openrlhf.log").exists()  # the job never started


def test_launch_without_the_environment_says_how_to_build_it(a100x8, tmp_path, monkeypatch):
    monkeypatch.setattr(envs, "ENV_ROOT", tmp_path / "no-envs")
    orl_plan.plan(a100x8["config"], 1, tmp_path / "plan", a100x8["inputs"])
    proc = subprocess.run(["bash", str(tmp_path / "plan" / "launch.sh"), str(tmp_path / "run")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "remax-bench env openrlhf" in proc.stderr


# -------------------------------------------------------------------------------------------------------- patch

def _patch_module():
    spec = importlib.util.spec_from_file_location("remax_patch", orl_plan.REMAX_DIR / "remax_patch.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_patch_edits_each_passage_once_and_only_once(tmp_path):
    patch = _patch_module()
    root = tmp_path / "openrlhf"
    for rel, edits in patch.EDITS.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("# before\n" + "# between\n".join(old for old, _ in edits) + "# after\n")
    assert sorted(p.relative_to(root).as_posix() for p in patch.apply(root)) == sorted(patch.EDITS)
    for rel, edits in patch.EDITS.items():
        text = (root / rel).read_text()
        assert all(new in text for _, new in edits)
    assert patch.apply(root) == []  # already patched: nothing written


def test_patch_refuses_a_different_source_and_writes_nothing(tmp_path):
    patch = _patch_module()
    root = tmp_path / "openrlhf"
    for rel, edits in patch.EDITS.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("".join(old for old, _ in edits))
    changed = root / "trainer/ppo_utils/experience_maker.py"
    changed.write_text(changed.read_text().replace('"flash_reinforce",\n            ]:', '"flash_reinforce"]:'))
    before = {rel: (root / rel).read_text() for rel in patch.EDITS}
    with pytest.raises(patch.PatchError, match=r"experience_maker\.py: passage 2 of the 0\.11\.2 source found 0 times"):
        patch.apply(root)
    assert {rel: (root / rel).read_text() for rel in patch.EDITS} == before


# ------------------------------------------------------- OpenRLHF's own code, in the CPU environment openrlhf-validate

@pytest.fixture(scope="session")
def openrlhf_python():
    """openrlhf 0.11.2 (patched) with its CPU-installable dependencies, built once into .venvs/openrlhf-validate."""
    return orl_conformance.ensure_validate_env()


PARSE = FIXTURES / "parse_check.py"  # runs in openrlhf-validate


def test_planned_command_passes_openrlhfs_own_parser(openrlhf_python, planned):
    argv = json.loads((planned / "plan.json").read_text())["argv"][3:]
    renamed = {"flat_pretrain": [a if a != "--actor.model_name_or_path" else "--pretrain" for a in argv],
               "old_n_samples": [a if a != "--rollout.n_samples_per_prompt" else "--n_samples_per_prompt"
                                 for a in argv],
               "typo": argv + ["--algo.advantage.estimatr", "remax"]}
    proc = subprocess.run([str(openrlhf_python), PARSE, str(orl_plan.REMAX_DIR), json.dumps(argv),
                           json.dumps(renamed)], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": f"{orl_conformance.STUBS}:{REPO}"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    args = result["good"]
    assert args["algo"]["advantage"]["estimator"] == "remax" and args["algo"]["advantage"]["gamma"] == 1.0
    assert args["reward"]["remote_url"] == ["agent"]  # OpenRLHF's own rewrite when an agent file is given
    assert args["train"]["agent_func_path"] == str(planned / "remax_agent.py")
    assert args["critic"]["model_name_or_path"] is None  # no critic for a non-GAE estimator
    assert (args["train"]["seed"], args["train"]["colocate_all"], args["vllm"]["num_engines"]) == (3, True, 8)
    assert args["actor"]["adam"]["betas"] == [0.9, 0.999] and args["actor"]["lr_scheduler"] == "constant"
    assert result["bad"] == {"flat_pretrain": 2, "old_n_samples": 2, "typo": 2}
    for unknown in ("--pretrain", "--n_samples_per_prompt", "--algo.advantage.estimatr"):
        assert "unrecognized arguments: " + unknown in proc.stderr


def test_remax_estimator_matches_the_reference_in_a_ray_worker(openrlhf_python, tmp_path):
    out = tmp_path / "conformance.json"
    proc = orl_conformance.run_validate(openrlhf_python, "conformance", out, "--ray-worker")
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    result = json.loads(out.read_text())
    for name, case in CASES.items():
        np.testing.assert_allclose(result[name]["reference"], reference_advantages(case).tolist(), atol=1e-7)
    table = orl_conformance.conformance_table(result).set_index("case")
    assert table.loc["outcome", "verdict"] == table.loc["outcome_kl_in_reward", "verdict"] == "match"
    assert table.loc["outcome_kl_in_reward", "max_abs_diff"] < 1e-5
    # Dense rewards: OpenRLHF's one scalar per sample puts total - baseline on every token (computed by hand).
    dense = CASES["dense"]
    by_hand = [[(sum(s * m for s, m in zip(scores, mask)) - b) * m for m in mask]
               for scores, mask, b in zip(dense["token_scores"], dense["mask"], dense["baselines"])]
    np.testing.assert_allclose(result["dense"]["advantages"], by_hand, atol=1e-7)
    assert table.loc["dense", "verdict"] == "differs" and "one scalar reward per sample" in table.loc["dense", "note"]


@pytest.fixture
def reward_server():
    srv = RewardServer("127.0.0.1", 0, load_shared_reward({"kind": "rule"}))
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv
    srv.shutdown()
    srv.server_close()


# (fixed length, sampling seed): the plan's agent config as off writes it, and a fixed length as strict writes it.
@pytest.mark.parametrize(("fixed_length", "sampling_seed"), [(False, None), (True, 7)])
def test_agent_sends_samples_and_one_greedy_request_and_scores_both(openrlhf_python, tmp_path, reward_server,
                                                                    fixed_length, sampling_seed):
    agent_dir = tmp_path / "agent"
    agent_dir.mkdir()
    shutil.copy2(orl_plan.REMAX_DIR / "remax_agent.py", agent_dir)
    (agent_dir / "remax_agent.json").write_text(json.dumps({"reward_url": reward_server.url + "/get_reward",
                                                            "min_tokens_is_max_tokens": fixed_length,
                                                            "sampling_seed": sampling_seed}))
    n, dead_url = 3, f"http://127.0.0.1:{_free_port()}/get_reward"
    pairs = ["12+34=46", "5+7=13"]  # the second label is wrong on purpose: the greedy answer 12 scores 0.5
    out = tmp_path / "agent.json"
    proc = subprocess.run([str(openrlhf_python), str(FIXTURES / "agent_check.py"), str(agent_dir / "remax_agent.py"),
                           str(out), str(n), dead_url, *pairs], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(orl_conformance.STUBS)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["error"] is None
    prompts = [p.split("=")[0] + "=" for p in pairs] * 2  # two steps
    assert [len(r) for r in result["rollouts"]] == [n] * len(prompts)
    for prompt, samples in zip(prompts, result["rollouts"]):
        requests = [q for q in result["requests"] if q["prompt"] == prompt]
        greedy = [q for q in requests if q["temperature"] == 0.0]
        assert len(requests) == 2 * (n + 1) and len(greedy) == 2  # n samples + 1 greedy per prompt per step
        assert all((q["top_p"], q["top_k"], q["max_tokens"]) == (1.0, -1, 8) for q in greedy)
        assert all(q["temperature"] == 1.0 for q in requests if q not in greedy)
        # remax.generation_length: the shared spec's min_tokens 0 (not OpenRLHF's default 1), or every request
        # (greedy too) at max_tokens.
        assert all(q["min_tokens"] == (8 if fixed_length else 0) for q in requests)
        a, b = prompt[:-1].split("+")
        greedy_answer = str(int(a) + int(b))
        for s in samples:
            assert s["reward"] == s["scores"] == reward.score(prompt, s["response"], s["label"])
            assert s["extra_logs"]["remax_baseline"] == reward.score(prompt, greedy_answer, s["label"])
            assert s["extra_logs"]["remax_baseline_tokens"] == len(greedy_answer) + 1  # with EOS
            # The sampled tokens' log-probs, as OpenRLHF's executor collects them (0 on the prompt): the mismatch.
            response_tokens = len(s["rollout_log_probs"]) - s["start"]
            assert s["rollout_log_probs"] == [0.0] * s["start"] + [-0.25 * (i + 1) for i in range(response_tokens)]
            assert response_tokens == len(s["response"]) + 1  # with EOS
        # Every sampled request asks for its token's log-prob, the greedy one for none.
        assert all(q["logprobs"] == (None if q in greedy else 1) for q in requests)
    baselines = {s["prompt"]: s["extra_logs"]["remax_baseline"] for r in result["rollouts"] for s in r}
    assert baselines == {"12+34=": 1.0, "5+7=": 0.5}
    # strict: every sampled request has a seed of its own, and a rerun whose requests finish in another order asks
    # for the same ones; greedy requests, and every request under off, have none (OpenRLHF's own behaviour).
    sampled = [q["seed"] for q in result["requests"] if q["temperature"] > 0]
    assert all(q["seed"] is None for q in result["requests"] if q["temperature"] == 0.0)
    if sampling_seed is None:
        assert sampled == [None] * len(sampled)
    else:
        assert len(set(sampled)) == len(sampled) == len(prompts) * n and None not in sampled
        assert sorted(sampled) == sorted(q["seed"] for q in result["rerun_requests"] if q["temperature"] > 0)
    # Without its reward server a rollout fails, naming the server, instead of leaving a sample without reward.
    assert result["dead_url_error"].startswith(f"RewardRequestError: reward server {dead_url}: no answer after 5 tries")


def test_a_new_revision_of_the_patch_rebuilds_the_environments_it_patches(tmp_path, monkeypatch):
    """remax_patch.py refuses a package an older revision patched; the environments that apply it name it with
    `#!digest`, so a new revision changes their digest and ensure_env builds them again from the pristine package."""
    from harness.runtime import envs

    for name in ("openrlhf", "openrlhf-validate", "openrlhf-cpu"):
        assert orl_plan.REMAX_DIR / orl_plan.PATCH in envs.digest_files(envs.spec_path(name))
    patch = tmp_path / "patch.py"
    patch.write_text("revision 1\n")
    (tmp_path / "frameworks" / "tiny" / "envs").mkdir(parents=True)
    (tmp_path / "frameworks" / "tiny" / "envs" / "tiny.txt").write_text(
        f"#!digest {os.path.relpath(patch, envs.REPO)}\n")
    monkeypatch.setattr(envs, "FRAMEWORK_FOLDERS", tmp_path / "frameworks")
    python = envs.ensure_env("tiny", root=tmp_path / "venvs")
    (python.parent / "built-by-revision-1").touch()
    assert envs.ensure_env("tiny", root=tmp_path / "venvs") == python
    assert (python.parent / "built-by-revision-1").exists()  # reused
    patch.write_text("revision 2\n")
    envs.ensure_env("tiny", root=tmp_path / "venvs")
    assert not (python.parent / "built-by-revision-1").exists()  # rebuilt from scratch
