rule report:
    input:
        summary=rules.summarize.output[0],
        metrics=metric_files(),
    output:
        table=report(f"{RESULTS}/report/throughput.md", caption="../report/throughput.rst", category="Throughput"),
        csv=f"{RESULTS}/report/throughput.csv",
        curve=report(f"{RESULTS}/report/reward_curve.png", caption="../report/reward_curve.rst", category="Reward"),
    log:
        f"{RESULTS}/logs/report.log",
    conda:
        "../envs/harness.yaml"
    params:
        results=lambda w, input: os.path.dirname(input.summary),
        out=lambda w, output: os.path.dirname(output.table),
    shell:
        "remax-bench report {params.results} --out {params.out} > {log} 2>&1"
