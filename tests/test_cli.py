import argparse

import pytest
from conftest import REPO, run_cli

from harness.cli import main


def test_run_with_a_broken_config_exits_2_naming_the_key_and_writes_nothing(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("remax: {steps: 0}\n")
    out = tmp_path / "run"
    proc = run_cli("run", "reference", "--config", config, "--seed", 1, "--out", out, "--inputs", tmp_path)
    assert proc.returncode == 2
    assert f"{config}: invalid config" in proc.stderr
    assert "at remax.steps: 0 is less than the minimum of 1" in proc.stderr
    assert not out.exists()


def test_run_without_built_inputs_names_the_missing_input(tmp_path):
    out = tmp_path / "run"
    proc = run_cli("run", "reference", "--config", REPO / "workflows/config/cpu.yaml", "--seed", 1, "--out", out,
                   "--inputs", tmp_path)
    assert proc.returncode == 2 and f"{tmp_path}/dataset.jsonl: input is missing" in proc.stderr
    assert not out.exists()


def test_unknown_framework_exits_2(tmp_path):
    proc = run_cli("run", "deepspeed-magic", "--config", REPO / "workflows/config/cpu.yaml", "--seed", 1,
                   "--out", tmp_path / "x")
    assert proc.returncode == 2 and "unknown framework 'deepspeed-magic'" in proc.stderr


@pytest.mark.parametrize("argv, flag, said", [
    (["plan", "verl", "--config", "c.yaml", "--seed", "-5", "--out", "p"], "--seed", "at least 0, not -5"),
    (["run", "reference", "--config", "c.yaml", "--seed", "x", "--out", "r"], "--seed", "an integer, not 'x'"),
    (["ingest", "reference", "r", "--out", "m.parquet", "--n-gpus", "-3"], "--n-gpus", "at least 0, not -3"),
    (["launch", "p", "--out", "r", "--config", "c.yaml", "--timeout-min", "inf"], "--timeout-min",
     "a finite number, not 'inf'"),
    (["reproduce", "r", "--out", "o", "--timeout-min", "0"], "--timeout-min", "a finite number above 0, not '0'"),
    (["serve-reward", "--port", "70000"], "--port", "a TCP port (0-65535; 0 = any free one), not 70000"),
    (["serve-reward", "--health-check", "http://127.0.0.1:1/health", "--timeout", "-1"], "--timeout",
     "a number of seconds from 0 to 604800 (7 days), not '-1'"),
    (["serve-reward", "--health-check", "http://127.0.0.1:1/health", "--timeout", "nan"], "--timeout",
     "a finite number, not 'nan'"),
    (["launch", "p", "--out", "r", "--config", "c.yaml", "--timeout-min", "nan"], "--timeout-min",
     "a finite number, not 'nan'"),
    (["baseline", "update", "--out", "b.json", "--last", "0"], "--last", "at least 1, not 0"),
    (["ab", "--a", "A", "--b", "B", "--config", "c.yaml", "--out", "o", "--alpha", "1.5"], "--alpha",
     "a number between 0 and 1, not '1.5'"),
    (["ab", "--a", "A", "--b", "B", "--config", "c.yaml", "--out", "o", "--seeds", "1,-2"], "--seeds",
     "seeds: comma-separated integers from 0 to 4294967295, not '1,-2'"),
])
def test_a_number_out_of_range_on_the_command_line_is_exit_2_naming_the_flag(argv, flag, said, capsys):
    """NaN and infinity too: `launch --timeout-min nan` never timed out, its wait loop spinning at 100% CPU."""
    with pytest.raises(SystemExit) as refused:
        main(argv)
    err = capsys.readouterr().err
    assert refused.value.code == 2 and f"argument {flag}: {said}" in err and "Traceback" not in err, err


def _options(p: argparse.ArgumentParser, command: str = ""):
    """(subcommand, action) of every option and positional of every subcommand, nested ones too, but serve-reward."""
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sp in action.choices.items():
                yield from _options(sp, f"{command} {name}".strip())
        elif command != "serve-reward" and action.nargs != 0 and not isinstance(action, argparse._HelpAction):
            yield command, action


def _numeric(parse) -> bool:
    for probe in ("1", "2", "0.5", "0", "3"):
        try:
            value = parse(probe)
        except (argparse.ArgumentTypeError, ValueError, TypeError):
            continue
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return False


def test_every_numeric_option_has_a_range_checking_type():
    """So that no later option forgets one: int or float, or a type without both bounds, fails here."""
    from harness.cli import parser

    options = list(_options(parser()))
    assert len(options) > 60 and ("ab", "--max-pairs") in {(c, a.option_strings[0]) for c, a in options if
                                                           a.option_strings}
    unbounded = []
    for command, action in options:
        name = f"{command} {action.option_strings[0] if action.option_strings else action.dest}"
        if action.type in (int, float):
            unbounded.append(f"{name}: type {action.type.__name__}, no range")
        elif action.type is not None and _numeric(action.type):
            for past in ("-9999999999999999999", "9999999999999999999", "-1e300", "1e300", "nan", "inf", "-inf"):
                try:
                    action.type(past)
                except argparse.ArgumentTypeError:
                    continue
                unbounded.append(f"{name}: takes {past}")
    assert unbounded == []


def test_every_option_that_names_a_value_refuses_an_empty_string():
    from harness.cli import parser

    open_ = []
    for command, action in _options(parser()):
        if action.choices is not None:
            continue
        try:
            (action.type or str)("")
        except argparse.ArgumentTypeError:
            continue
        open_.append(f"{command} {action.option_strings[0] if action.option_strings else action.dest}")
    assert open_ == []


@pytest.mark.parametrize("argv, flag, said", [
    (["ab", "--a", "", "--b", "HEAD", "--config", "c.yaml", "--out", "o"], "--a", "an empty"),
    (["ab", "--a", "HEAD", "--b=-x", "--config", "c.yaml", "--out", "o"], "--b", "starts with '-'"),
    (["ab", "--a", "HEAD", "--b", "HEAD", "--config", "", "--out", "o"], "--config", "an empty"),
    (["ab", "--a", "HEAD", "--b", "HEAD", "--config", "c.yaml", "--out", " "], "--out", "an empty"),
    (["ab", "--a", "A", "--b", "B", "--config", "c.yaml", "--out", "o", "--framework", ""], "--framework", "an empty"),
    (["bisect", "", "HEAD", "--config", "c.yaml", "--out", "o"], "good", "an empty"),
    (["bisect", "--config", "c.yaml", "--out", "o", "--", "HEAD", "--upload-pack=x"], "bad", "starts with '-'"),
    (["run", "", "--config", "c.yaml", "--seed", "1", "--out", "r"], "framework", "an empty"),
    (["report", "results", "--out", ""], "--out", "an empty"),
    (["ab", "--a", "A", "--b", "B", "--config", "c.yaml", "--out", "o", "--max-pairs", "501"], "--max-pairs",
     "at most 500, not 501"),
    (["bisect", "A", "B", "--config", "c.yaml", "--out", "o", "--min-pairs", "501"], "--min-pairs",
     "at most 500, not 501"),
    (["ingest", "reference", "r", "--out", "m.parquet", "--n-gpus", "65537"], "--n-gpus", "at most 65536, not 65537"),
    (["baseline", "update", "--out", "b.json", "--last", "10001"], "--last", "at most 10000, not 10001"),
])
def test_an_empty_value_a_git_ref_like_an_option_or_a_count_past_its_range_is_exit_2_naming_it(argv, flag, said,
                                                                                                 capsys, tmp_path,
                                                                                                 monkeypatch):
    """`ab --a ""` started a real A/B of the current checkout; `--b=-x` reached git as an option."""
    monkeypatch.chdir(tmp_path)  # not a repository: whatever was not refused stops before it starts anything
    with pytest.raises(SystemExit) as refused:
        main(argv)
    err = capsys.readouterr().err
    assert refused.value.code == 2 and f"argument {flag}: " in err and said in err and "Traceback" not in err, err


def test_the_cli_caps_are_the_ones_the_code_holds():
    from harness.cli.args import MAX_GPUS, MAX_PAIRS
    from harness.comparison.ab import MAX_PAIRS as AB_MAX_PAIRS
    from harness.config import schema

    launch = schema()["properties"]["launch"]["properties"]
    assert MAX_PAIRS == AB_MAX_PAIRS and launch["gpus_per_node"]["maximum"] * launch["nnodes"]["maximum"] == MAX_GPUS


def test_the_reward_settings_the_config_allows_are_ones_the_reward_server_takes():
    """launch.sh passes reward.batch_size and reward.max_length on to serve-reward: its range must hold the config's."""
    from harness.cli import parser
    from harness.config import schema

    reward = schema()["properties"]["reward"]["properties"]
    for key, flag in (("batch_size", "--batch-size"), ("max_length", "--max-length")):
        for value in (reward[key]["minimum"], reward[key]["maximum"]):
            args = parser().parse_args(["serve-reward", flag, str(value)])
            assert getattr(args, key) == value
