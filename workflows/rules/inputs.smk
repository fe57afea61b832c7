rule freeze_config:
    output:
        f"{RESULTS}/{layout.CONFIG}",
    log:
        f"{RESULTS}/logs/freeze_config.log",
    conda:
        "../envs/harness.yaml"
    params:
        # A function, so that Snakemake does not read a brace in a config value as a wildcard.
        config=lambda wildcards: json.dumps(config, sort_keys=True),
    shell:
        "remax-bench freeze-config --json {params.config:q} --out {output:q} > {log:q} 2>&1"


rule dataset:
    input:
        config=rules.freeze_config.output[0],
    output:
        data=f"{INPUTS}/dataset.jsonl",
        sha=f"{INPUTS}/dataset.jsonl.sha256",
    log:
        f"{RESULTS}/logs/inputs/dataset.log",
    conda:
        "../envs/harness.yaml"
    params:
        inputs=lambda w, output: os.path.dirname(output.data),
    shell:
        "remax-bench inputs dataset --config {input.config:q} --inputs {params.inputs:q} > {log:q} 2>&1"


rule policy:
    input:
        config=rules.freeze_config.output[0],
        data=rules.dataset.output.data,
        sha=rules.dataset.output.sha,
    output:
        model=directory(f"{INPUTS}/policy"),
        sha=f"{INPUTS}/policy.sha256",
        record=f"{INPUTS}/policy.build.json",
    log:
        f"{RESULTS}/logs/inputs/policy.log",
    conda:
        "../envs/harness.yaml"
    params:
        inputs=lambda w, output: os.path.dirname(output.sha),
    shell:
        "remax-bench inputs policy --config {input.config:q} --inputs {params.inputs:q} > {log:q} 2>&1"


rule reward:
    input:
        config=rules.freeze_config.output[0],
        data=rules.dataset.output.data,
        model=rules.policy.output.model,
        sha=rules.policy.output.sha,
    output:
        reward=directory(f"{INPUTS}/reward"),
        sha=f"{INPUTS}/reward.sha256",
    log:
        f"{RESULTS}/logs/inputs/reward.log",
    conda:
        "../envs/harness.yaml"
    params:
        inputs=lambda w, output: os.path.dirname(output.sha),
    shell:
        "remax-bench inputs reward --config {input.config:q} --inputs {params.inputs:q} > {log:q} 2>&1"
