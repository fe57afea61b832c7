# Each real framework's own ReMax advantage code on the shared test vectors, against the reference
# (harness/conformance.py): part of every profile that runs a real framework (common.smk, CONFORMING), in the runs'
# own environments on a CPU profile and in the frameworks' CPU check environments on a GPU one; the report's
# conformance table shows it. `snakemake --cores all conformance` runs it alone.


rule conformance:
    input:
        config=rules.freeze_config.output[0],
        envs=conformance_inputs,
    output:
        f"{RESULTS}/{layout.CONFORMANCE}",
    log:
        f"{RESULTS}/logs/conformance.log",
    conda:
        "../envs/harness.yaml"
    shell:
        "remax-bench conformance --config {input.config:q} --out {output:q} > {log:q} 2>&1"
