# Is B slower than A? A paired A/B of two commits on this machine (harness/comparison/ab.py; docs/regression.md):
#   snakemake --cores 1 ab --config ab='{a: v0.1, b: HEAD}'
#   snakemake --cores 1 ab --configfile workflows/config/cpu-frameworks.yaml \
#       --config ab='{a: HEAD, b: HEAD, framework: dschat, b_env: [dschat-cpu=ds-0.19.7.txt]}'
# Both arms run this profile's config on one framework (the reference backend unless ab names one), interleaved;
# results/ab/index.md is the page. The arms are not part of the experiment's config (common.smk takes them out), so
# naming them reruns nothing else.


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
        arms=lambda w: ab_arms(),
    # Exit 1 (B slower) and 4 (inconclusive) keep the page; the `ab` target below turns slower into a failure.
    shell:
        "remax-bench ab {params.arms:q} --config {input.config:q} --out {output:q} > {log:q} 2>&1"
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
