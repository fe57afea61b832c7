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
        "remax-bench ingest {wildcards.framework:q} {input:q} --out {output:q} > {log:q} 2>&1"
