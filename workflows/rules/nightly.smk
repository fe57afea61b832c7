# The nightly job (harness/comparison/nightly.py; docs/regression.md, "The nightly job"):
#   snakemake --cores all nightly [--config nightly='{framework: reference, budget: 15}'] --forcerun run_embedded
# The pipeline runs and its history is appended and checked (rules/check.smk: the record, and the trigger for a
# baseline's slow drift), then tonight's commit runs against the baseline's as a paired A/B on this machine; only a
# slowdown the A/B confirms fails the target, and where the commits differ its bisection names the first slow commit.


rule nightly_ab:
    input:
        config=rules.freeze_config.output[0],
        baseline=f"baselines/{config['profile']}.json",  # the working directory's (the repository's, normally)
        alerts=rules.alerts.output.json,
    output:
        directory(f"{RESULTS}/{layout.NIGHTLY}"),
    log:
        f"{RESULTS}/logs/nightly.log",
    conda:
        "../envs/harness.yaml"
    params:
        options=NIGHTLY,
        results=lambda w, output: os.path.dirname(output[0]),
    resources:
        timed_run=1,
    # Exit 1 (confirmed slower) keeps the record; the `nightly` target below turns it into a failure.
    shell:
        "remax-bench nightly --baseline {input.baseline:q} --config {input.config:q} --history-check {input.alerts:q}"
        " --results {params.results:q} {params.options:q} --out {output:q} > {log:q} 2>&1 || test $? -eq 1"


rule nightly:
    input:
        rules.nightly_ab.output[0],
    log:
        f"{RESULTS}/logs/nightly_verdict.log",
    localrule: True
    conda:
        "../envs/harness.yaml"
    shell:
        "cat {input:q}/summary.md | tee {log:q}; python -c 'import json, sys; "
        "sys.exit(json.load(open(sys.argv[1]))[\"outcome\"] == \"slower\")' {input:q}/nightly.json"
