rule run_embedded:
    input:
        config=rules.freeze_config.output[0],
        data=rules.dataset.output.data,
        model=rules.policy.output.model,
        sha=rules.policy.output.sha,
        reward=rules.reward.output.reward,
        reward_sha=rules.reward.output.sha,
    output:
        directory(f"{RESULTS}/{layout.RUN}"),
    log:
        f"{RESULTS}/{layout.RUN_LOG}",
    wildcard_constraints:
        framework=EMBEDDED_PATTERN,
    conda:
        "../envs/harness.yaml"
    params:
        inputs=lambda w, input: os.path.dirname(input.data),
    resources:
        timed_run=1,
    shell:
        "remax-bench run {wildcards.framework:q} --config {input.config:q} --seed {wildcards.seed:q}"
        " --inputs {params.inputs:q} --out {output:q} > {log:q} 2>&1"


rule run_planned:
    input:
        config=rules.freeze_config.output[0],
        plan=rules.plan.output[0],
        env=framework_env_stamp,
        sources=framework_sources,
    output:
        directory(f"{RESULTS}/{layout.RUN}"),
    log:
        f"{RESULTS}/{layout.RUN_LOG}",
    wildcard_constraints:
        framework=PLANNED_PATTERN,
    conda:
        "../envs/harness.yaml"
    params:
        timeout_min=config["launch"]["timeout_min"],
    resources:
        timed_run=1,
        gpu=config["launch"]["gpus_per_node"] * config["launch"]["nnodes"],
        gpu_model=config["launch"]["gpu_model"],
        nodes=config["launch"]["nnodes"],
        runtime=config["launch"]["timeout_min"] + 10,
    shell:
        # the job log and the console both get the launcher's progress lines (Snakemake's bash has pipefail)
        "remax-bench launch {input.plan:q} --config {input.config:q} --out {output:q} --timeout-min {params.timeout_min:q}"
        " 2>&1 | tee {log:q}"
