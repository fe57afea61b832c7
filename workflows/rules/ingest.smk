rule ingest:
    input:
        f"{RESULTS}/runs/{{framework}}/seed{{seed}}",
    output:
        f"{RESULTS}/metrics/{{framework}}/seed{{seed}}.parquet",
    log:
        f"{RESULTS}/logs/ingest/{{framework}}_seed{{seed}}.log",
    conda:
        "../envs/harness.yaml"
    shell:
        "remax-bench ingest {wildcards.framework} {input} --out {output} > {log} 2>&1"
