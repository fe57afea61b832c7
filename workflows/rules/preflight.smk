# `remax-bench preflight` (harness/frameworks/preflight.py) before the first job of a profile that runs real frameworks on GPUs:
# environments, checkouts and plans wait for it, so a node that cannot run the profile fails in seconds, with every
# reason at once (results/logs/preflight.log), not after an hour of environment building.


rule preflight:
    input:
        config=rules.freeze_config.output[0],
    output:
        f"{RESULTS}/{layout.PREFLIGHT}",
    log:
        f"{RESULTS}/logs/preflight.log",
    conda:
        "../envs/harness.yaml"
    params:
        results=lambda w, output: os.path.dirname(output[0]),
    resources:
        # under SLURM it runs on a node like the runs' (their GPU count and model), which is the node it checks
        gpu=config["launch"]["gpus_per_node"],
        gpu_model=config["launch"]["gpu_model"],
    shell:
        "remax-bench preflight --config {input.config:q} --results {params.results:q} --out {output:q} > {log:q} 2>&1"
