# Is B slower than A? A paired A/B of two commits on this machine (harness/regression/ab.py; docs/regression.md):
#   snakemake --cores 1 ab --config ab='{a: v0.1, b: HEAD}'
# Both arms run this profile's config on the reference backend, interleaved; results/ab/index.md is the page. The
# arms are not part of the experiment's config (common.smk takes them out), so naming them reruns nothing else.


rule ab_compare:
    input:
        config=rules.freeze_config.output[0],
    output:
        directory(f"{RESULTS}/{layout.AB}"),
    log:
        f"{RESULTS}/logs/ab.log",
    conda:
        "../envs/harness.yaml"
    params:
        a=lambda w: ab_arms()[0],
        b=lambda w: ab_arms()[1],
    # Exit 1 (B slower) and 4 (inconclusive) keep the page; the `ab` target below turns slower into a failure.
    shell:
        "remax-bench ab --a {params.a:q} --b {params.b:q} --config {input.config:q} --out {output:q} > {log:q} 2>&1"
        " || test $? -eq 1 -o $? -eq 4"


rule ab:
    input:
        rules.ab_compare.output[0],
    log:
        f"{RESULTS}/logs/ab_verdict.log",
    localrule: True
    conda:
        "../envs/harness.yaml"
    shell:
        "cat {input:q}/index.md | tee {log:q}; python -c 'import json, sys; "
        "sys.exit(json.load(open(sys.argv[1]))[\"verdict\"][\"verdict\"] == \"slower\")' {input:q}/ab.json"
