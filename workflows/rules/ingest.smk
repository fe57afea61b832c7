rule ingest:
    input:
        f"{RESULTS}/{layout.RUN}",
    output:
        f"{RESULTS}/{layout.METRICS}",
    log:
        f"{RESULTS}/{layout.INGEST_LOG}",
    conda:
        "../envs/harness.yaml"
    shell:
        "remax-bench ingest {wildcards.framework} {input} --out {output} > {log} 2>&1"
