rule summarize:
    input:
        config=rules.freeze_config.output[0],
        metrics=metric_files(),
        runs=runnable_run_dirs(),
        policy=rules.policy.output.model,
    output:
        f"{RESULTS}/{layout.SUMMARY}",
    log:
        f"{RESULTS}/logs/summarize.log",
    conda:
        "../envs/harness.yaml"
    shell:
        "remax-bench summarize --config {input.config:q} --metrics {input.metrics:q} --runs {input.runs:q}"
        " --policy {input.policy:q} --out {output:q} > {log:q} 2>&1"
