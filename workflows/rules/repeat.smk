# Repeats (reproducibility.repeat_seeds): each a run of its own, made again from the original's manifest by
# `remax-bench reproduce`, which refuses (exit 2, naming what) when inputs, commit, packages or machine changed, and
# writes reproduce.json: identical, or the first step and metric where the repeat diverged.


rule repeat:
    input:
        run=f"{RESULTS}/{layout.RUN}",
        config=rules.freeze_config.output[0],
    output:
        directory(f"{RESULTS}/{layout.REPEAT}"),
    log:
        f"{RESULTS}/{layout.REPEAT_LOG}",
    wildcard_constraints:
        repeat=r"\d+",
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
        "remax-bench reproduce {input.run:q} --out {output:q} --timeout-min {params.timeout_min:q} > {log:q} 2>&1"
