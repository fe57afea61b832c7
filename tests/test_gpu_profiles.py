"""The GPU profiles without a GPU: Snakemake's dry run shows the full matrix with the right resources."""

import re

import pytest
from conftest import REPO, snakemake

pytestmark = pytest.mark.e2e


def job_counts(output: str) -> dict[str, int]:
    table = output.split("Job stats:")[1].split("\n\n")[0]
    return {name: int(n) for name, n in (line.split() for line in table.splitlines()[3:] if line.strip())}


@pytest.mark.parametrize("profile", [None, "slurm"])
def test_a100x8_dry_run_plans_every_framework_by_three_seeds(tmp_path, profile):
    import yaml

    from harness.frameworks import get_adapter

    adapters = [get_adapter(fw) for fw in yaml.safe_load((REPO / "workflows" / "config" / "a100x8.yaml").read_text())
                ["frameworks"]]
    runs_planned = 3 * len(adapters)
    args = ["-n", "--configfile", REPO / "workflows" / "config" / "a100x8.yaml"]
    args += ["--profile", REPO / "workflows" / "profiles" / "slurm"] if profile else ["--cores", "8"]
    proc = snakemake(tmp_path, *args)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    jobs = job_counts(out)
    assert jobs["plan"] == jobs["run_planned"] == runs_planned and jobs["ingest"] == runs_planned
    # each framework's GPU environment, and the CPU environment the conformance rule checks its ReMax in
    checked = {a.check_env for a in adapters}
    assert jobs["framework_env"] == len({a.env for a in adapters} | checked)
    assert jobs["dschat_checkout"] == 1 and jobs["conformance"] == 1
    conformance = out.split("rule conformance:")[1].split("\n\n")[0]
    assert {"verl-validate", "openrlhf-validate", "dschat-cpu"} <= checked
    assert all(f"results/envs/{env}.txt" in conformance for env in checked)
    assert jobs["report"] == jobs["summarize"] == jobs["history"] == 1
    runs = out.split("rule run_planned:")[1:]
    assert len(runs) == runs_planned
    for block in runs:
        resources = re.search(r"resources: (.*)", block).group(1)
        assert "gpu=8" in resources and "gpu_model=a100" in resources and "timed_run=1" in resources
        assert "runtime=250" in resources  # launch.timeout_min + 10
    assert not (tmp_path / "results").exists()
