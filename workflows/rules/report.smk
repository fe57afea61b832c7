rule report:
    input:
        config=rules.freeze_config.output[0],
        metrics=metric_files(),
        # optional: made by the `conformance` target; a new one re-renders the report
        conformance=[f"{RESULTS}/conformance.csv"] if os.path.exists(f"{RESULTS}/conformance.csv") else [],
    output:
        html=report(f"{RESULTS}/report/index.html", caption="../report/index.rst", category="Report"),
        table=report(f"{RESULTS}/report/throughput.md", caption="../report/throughput.rst", category="Throughput"),
        csv=f"{RESULTS}/report/throughput.csv",
        throughput=report(
            f"{RESULTS}/report/throughput.png", caption="../report/throughput_figure.rst", category="Throughput"
        ),
        step_time=report(f"{RESULTS}/report/step_time.png", caption="../report/step_time.rst", category="Step time"),
        curve=report(f"{RESULTS}/report/reward_curve.png", caption="../report/reward_curve.rst", category="Reward"),
        runs=report(f"{RESULTS}/report/runs.csv", caption="../report/runs.rst", category="Runs"),
    log:
        f"{RESULTS}/logs/report.log",
    conda:
        "../envs/harness.yaml"
    params:
        results=lambda w, input: os.path.dirname(input.config),
        out=lambda w, output: os.path.dirname(output.html),
    shell:
        "remax-bench report {params.results} --out {params.out} > {log} 2>&1"
