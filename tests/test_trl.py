"""TRL: the harness's ReMax trainer on TRL 1.16 (harness/frameworks/trl), run for real in the trl-cpu environment
through `remax-bench plan`, `launch` and `ingest`, its numbers checked against TRL's own log lines."""

import json
import shutil

import pytest

from harness import HarnessError
from harness.frameworks import get_adapter
from harness.frameworks.trl import conformance as trl_conformance
from harness.frameworks.trl import ingest as trl_ingest
from harness.frameworks.trl import plan as trl_plan
from harness.results.metrics import read_metrics
from harness.runtime import envs
from tests.conftest import REPO, make_inputs, run_cli, tiny_cpu_config

FIXTURES = REPO / "tests" / "fixtures" / "trl"
STEPS = 3


@pytest.fixture(scope="session")
def trl_env():
    try:
        return envs.ensure_env("trl-cpu")
    except HarnessError as e:
        pytest.fail(f"building the TRL CPU environment failed: {e}")


@pytest.fixture(scope="module")
def trl_run(tmp_path_factory, trl_env):
    """3 real ReMax steps of TRL on the CPU, planned, launched and ingested by the CLI."""
    d = tmp_path_factory.mktemp("trl")
    raw = tiny_cpu_config()
    raw["frameworks"] = ["trl"]
    raw["remax"].update(steps=STEPS, rollout_n=1, train_batch_size=8)
    cfg, _ = make_inputs(d, raw)
    for argv in (("plan", "trl", "--config", cfg, "--seed", 1, "--inputs", d / "inputs", "--out", d / "plan"),
                 ("launch", d / "plan", "--out", d / "run", "--timeout-min", 10, "--config", cfg),
                 ("ingest", "trl", d / "run", "--out", d / "metrics.parquet")):
        proc = run_cli(*argv)
        assert proc.returncode == 0, f"{argv[0]}: {proc.stderr[-3000:]}"
    return d


def test_real_steps_are_ingested_as_trl_logged_them(trl_run):
    df = read_metrics(trl_run / "metrics.parquet")
    plan = json.loads((trl_run / "run" / "plan.json").read_text())
    assert list(df["step"]) == list(range(1, STEPS + 1))
    assert set(df["run_id"]) == {plan["run_id"]} and set(df["framework_version"]) == {"trl-1.16.0"}
    logged = trl_ingest.parse_printed(trl_run / "run" / trl_plan.TRL_LOG)
    assert len(logged) == STEPS
    seen = 0.0
    for row, own in zip(df.itertuples(), logged):
        # PrinterCallback prints 4 significant digits
        assert row.reward_mean == pytest.approx(own["reward"], rel=1e-3, abs=1e-4)
        # TRL counts every generated sequence's prompt and completion: the sampled and the greedy ones
        assert own["num_tokens"] - seen == pytest.approx(2 * row.tokens_prompt + row.tokens_response
                                                         + row.tokens_baseline, rel=1e-3)
        seen = own["num_tokens"]
        assert row.time_gen_s > 0 and row.time_train_s > 0 and row.time_transition_s >= 0
        assert row.time_gen_s + row.time_transition_s + row.time_train_s <= row.time_step_s
    assert (df["framework_throughput_tok_s"] > df["throughput_tok_s"]).all()


def test_the_run_writes_its_evaluation_and_a_conformance_row_from_the_real_step(trl_run):
    record = json.loads((trl_run / "run" / "eval.json").read_text())
    assert 0 <= record["before"]["greedy_accuracy"] <= 1 and 0 <= record["after"]["greedy_accuracy"] <= 1
    batch = json.loads((trl_run / "run" / trl_plan.BATCH_LOG).read_text())
    assert any(v for row in batch["kl"] for v in row), "the recorded batch carries the KL to the reference"
    row = trl_conformance.run_conformance(trl_run / "run").iloc[0]
    assert row["verdict"] == "match" and row["source"] == "from a real run", row.to_dict()


def test_a_recorded_batch_whose_advantages_drop_the_kl_differs(trl_run, tmp_path):
    """The fault the real-run check exists for: an advantage computed without the KL term (a reverted line of the
    trainer) is reported as differing on the run's own batch."""
    run = tmp_path / "run"
    shutil.copytree(trl_run / "run", run, ignore=shutil.ignore_patterns("output"))
    batch = json.loads((run / trl_plan.BATCH_LOG).read_text())
    no_kl = {**batch, "kl_coef": 0.0}
    from harness.conformance import reference_advantages

    batch["advantages"] = reference_advantages(no_kl).tolist()
    (run / trl_plan.BATCH_LOG).write_text(json.dumps(batch))
    assert trl_conformance.run_conformance(run).iloc[0]["verdict"] == "differs"


def test_the_trainers_advantage_matches_the_reference_on_the_shared_vectors(trl_env):
    df = trl_conformance.conformance(None)
    applicable = df[df["verdict"] != "not applicable"]
    assert set(applicable["case"]) == {"outcome", "outcome_kl_in_reward"}, df.to_string()
    assert (applicable["verdict"] == "match").all(), df.to_string()


def test_trls_own_log_lines_are_read_and_a_garbled_one_is_named(tmp_path):
    logged = trl_ingest.parse_printed(FIXTURES / "trl_console.txt")
    assert [s["num_tokens"] for s in logged] == [2817.0, 5634.0, 8443.0]  # the summary line is not a step
    bad = tmp_path / "trl.log"
    bad.write_text("warming up\n" + (FIXTURES / "trl_console.txt").read_text().replace("'num_tokens': '5634'",
                                                                                       "'num_tokens': 5634'"))
    with pytest.raises(HarnessError, match=r"trl.log:3: garbled TRL log line"):
        trl_ingest.parse_printed(bad)


def test_a_plan_that_asks_for_more_than_one_sample_per_prompt_is_refused(tmp_path):
    raw = tiny_cpu_config()
    raw["frameworks"] = ["trl"]
    cfg, _ = make_inputs(tmp_path, raw)  # rollout_n 2
    proc = run_cli("plan", "trl", "--config", cfg, "--seed", 1, "--inputs", tmp_path / "inputs",
                   "--out", tmp_path / "plan")
    assert proc.returncode == 2 and "remax.rollout_n: 2" in proc.stderr
    assert not (tmp_path / "plan").exists()


def test_the_cpu_plan_states_its_deviations_and_the_strict_knob(tmp_path):
    raw = tiny_cpu_config()
    raw["frameworks"] = ["trl"]
    raw["remax"]["rollout_n"] = 1
    raw["reproducibility"] = {"determinism": "strict"}
    cfg, _ = make_inputs(tmp_path, raw)
    proc = run_cli("plan", "trl", "--config", cfg, "--seed", 1, "--inputs", tmp_path / "inputs",
                   "--out", tmp_path / "plan")
    assert proc.returncode == 0, proc.stderr
    plan = json.loads((tmp_path / "plan" / "plan.json").read_text())
    assert {d["key"] for d in plan["deviations"]} >= {"device", "generation", "remax.baseline"}
    assert "--deterministic" in plan["argv"] and plan["determinism"]["mode"] == "strict"
    assert plan["argv"][0] == str(envs.ENV_ROOT / "trl-cpu" / "bin" / "python")
    assert get_adapter("trl").cpu_env == "trl-cpu"
    assert plan["argv"][plan["argv"].index("--kl-coef") + 1] == repr(float(raw["remax"]["kl_coef"]))


def test_fixed_generation_length_holds_every_response_to_max_length(tmp_path, trl_env):
    """remax.generation_length fixed: the sampled and the greedy responses all have max_response_length tokens, as
    throughput tables are measured (min_new_tokens through TRL's generation_kwargs, which its greedy call keeps)."""
    raw = tiny_cpu_config()
    raw["frameworks"] = ["trl"]
    raw["remax"].update(steps=2, rollout_n=1, train_batch_size=8, generation_length="fixed")
    cfg, config = make_inputs(tmp_path, raw)
    for argv in (("plan", "trl", "--config", cfg, "--seed", 1, "--inputs", tmp_path / "inputs", "--out",
                  tmp_path / "plan"),
                 ("launch", tmp_path / "plan", "--out", tmp_path / "run", "--timeout-min", 10, "--config", cfg),
                 ("ingest", "trl", tmp_path / "run", "--out", tmp_path / "metrics.parquet")):
        proc = run_cli(*argv)
        assert proc.returncode == 0, f"{argv[0]}: {proc.stderr[-3000:]}"
    df = read_metrics(tmp_path / "metrics.parquet")
    full = 8 * config["remax"]["max_response_length"]
    assert (df["tokens_response"] == full).all() and (df["tokens_baseline"] == full).all(), df.to_string()
