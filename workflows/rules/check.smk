# Regression alerts (harness/regression/history.py, harness/regression/check.py; docs/regression.md).
# `snakemake --cores all check`: appends this pipeline run to the history, writes results/alerts.md|json, the
# verdict for CI (results/alerts-summary.md, results/alerts-junit.xml; $GITHUB_STEP_SUMMARY where set) and
# fails when a throughput or transition-time regression is found. The history itself is not a rule output:
# Snakemake deletes a rule's outputs before it reruns, and the history must outlive every run.


rule history:
    input:
        summary=rules.summarize.output[0],
        runs=rules.summarize.input.runs,
        metrics=rules.summarize.input.metrics,
    output:
        f"{RESULTS}/{layout.HISTORY_RECEIPT}",
    log:
        f"{RESULTS}/logs/history.log",
    conda:
        "../envs/harness.yaml"
    params:
        results=lambda w, input: os.path.dirname(input.summary),
    shell:
        "remax-bench history append --results {params.results:q} --receipt {output:q} > {log:q} 2>&1"


rule alerts:
    input:
        receipt=rules.history.output[0],
        baseline=f"baselines/{config['profile']}.json",  # the working directory's (the repository's, normally)
    output:
        md=f"{RESULTS}/{layout.ALERTS}",
        json=f"{RESULTS}/{layout.ALERTS_JSON}",
        summary=f"{RESULTS}/{layout.ALERTS_SUMMARY}",
        junit=f"{RESULTS}/{layout.ALERTS_JUNIT}",
    log:
        f"{RESULTS}/logs/alerts.log",
    conda:
        "../envs/harness.yaml"
    params:
        results=lambda w, output: os.path.dirname(output.json),
    # Exit 1 (a regression) keeps the alerts as outputs; the `check` target below turns it into a failure.
    shell:
        "remax-bench check --baseline {input.baseline:q} --results {params.results:q} --summary-md {output.summary:q} "
        "--junit {output.junit:q} > {log:q} 2>&1 || test $? -eq 1"


rule check:
    input:
        md=rules.alerts.output.md,
        json=rules.alerts.output.json,
    log:
        f"{RESULTS}/logs/check.log",
    localrule: True
    conda:
        "../envs/harness.yaml"
    # The verdict is alerts.json's top-level status: its checks also say "regression" for the context figures and
    # the advisories, which never fail the check.
    shell:
        "cat {input.md:q} | tee {log:q}; python -c 'import json, sys; "
        "sys.exit(json.load(open(sys.argv[1]))[\"status\"] == \"regression\")' {input.json:q}"
