rule run_embedded:
    input:
        config=rules.freeze_config.output[0],
        data=rules.dataset.output.data,
        model=rules.policy.output.model,
        sha=rules.policy.output.sha,
    output:
        directory(f"{RESULTS}/runs/{{framework}}/seed{{seed}}"),
    log:
        f"{RESULTS}/logs/run/{{framework}}_seed{{seed}}.log",
    conda:
        "../envs/harness.yaml"
    params:
        inputs=lambda w, input: os.path.dirname(input.data),
    resources:
        timed_run=1,
    shell:
        "remax-bench run {wildcards.framework} --config {input.config} --seed {wildcards.seed}"
        " --inputs {params.inputs} --out {output} > {log} 2>&1"
