rule report:
    input:
        config=rules.freeze_config.output[0],
        summary=rules.summarize.output[0],
        metrics=metric_files(),
        repeats=repeat_dirs(),
        # part of every profile with a real framework; elsewhere shown when the `conformance` target made one
        conformance=[f"{RESULTS}/{layout.CONFORMANCE}"]
        if CONFORMING or os.path.exists(f"{RESULTS}/{layout.CONFORMANCE}")
        else [],
    output:
        html=report(f"{RESULTS}/{layout.REPORT}/index.html", caption="../report/index.rst", category="Report"),
        table=report(f"{RESULTS}/{layout.REPORT}/throughput.md", caption="../report/throughput.rst", category="Throughput"),
        csv=f"{RESULTS}/{layout.REPORT}/throughput.csv",
        throughput=report(
            f"{RESULTS}/{layout.REPORT}/throughput.png", caption="../report/throughput_figure.rst", category="Throughput"
        ),
        step_time=report(f"{RESULTS}/{layout.REPORT}/step_time.png", caption="../report/step_time.rst", category="Step time"),
        curve=report(f"{RESULTS}/{layout.REPORT}/reward_curve.png", caption="../report/reward_curve.rst", category="Reward"),
        runs=report(f"{RESULTS}/{layout.REPORT}/runs.csv", caption="../report/runs.rst", category="Runs"),
    log:
        f"{RESULTS}/logs/report.log",
    conda:
        "../envs/harness.yaml"
    params:
        results=lambda w, input: os.path.dirname(input.config),
        out=lambda w, output: os.path.dirname(output.html),
    shell:
        "remax-bench report {params.results:q} --summary {input.summary:q} --out {params.out:q} > {log:q} 2>&1"
