rule framework_env:
    input:
        # the description ships with the workflow (or in its framework's folder), wherever the working directory is
        lambda wildcards: str(env_spec(wildcards.env)),
        preflight_gate,
    output:
        f"{RESULTS}/{layout.ENV_STAMP}",
    log:
        f"{RESULTS}/{layout.ENV_LOG}",
    conda:
        "../envs/harness.yaml"
    shell:
        "remax-bench env {wildcards.env:q} --out {output:q} > {log:q} 2>&1"


rule plan:
    input:
        config=rules.freeze_config.output[0],
        data=rules.dataset.output.data,
        model=rules.policy.output.model,
        sha=rules.policy.output.sha,
        reward=rules.reward.output.reward,
        reward_sha=rules.reward.output.sha,
        preflight=preflight_gate,
    output:
        directory(f"{RESULTS}/{layout.PLAN}"),
    log:
        f"{RESULTS}/{layout.PLAN_LOG}",
    conda:
        "../envs/harness.yaml"
    params:
        inputs=lambda w, input: os.path.dirname(input.data),
    shell:
        "remax-bench plan {wildcards.framework:q} --config {input.config:q} --seed {wildcards.seed:q}"
        " --inputs {params.inputs:q} --out {output:q} > {log:q} 2>&1"
