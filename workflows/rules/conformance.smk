# `snakemake --cores all conformance`: each framework's own ReMax advantage code on the shared test vectors,
# against the reference (harness/conformance.py). Builds the frameworks' CPU environments once (minutes), so it is
# a target of its own, not part of the default run; the report shows results/conformance.csv when it exists.


rule conformance:
    input:
        config=rules.freeze_config.output[0],
    output:
        f"{RESULTS}/{layout.CONFORMANCE}",
    log:
        f"{RESULTS}/logs/conformance.log",
    conda:
        "../envs/harness.yaml"
    shell:
        "remax-bench conformance --config {input.config:q} --out {output:q} > {log:q} 2>&1"
