# Do the frameworks perform the same ReMax update? (harness/parity/): the reference writes one fixed batch from the
# shared inputs, each real framework's own training code makes one update from it in its own environment, and every
# quantity (log-probs, advantages, loss, gradient norm before and after the clip, the weights' update) is set beside
# the reference's. Part of every profile that runs a framework with a parity driver (common.smk, PARITY); the
# report's "Same update?" table shows it. `snakemake --cores all parity` runs it alone.


rule parity:
    input:
        config=rules.freeze_config.output[0],
        dataset=rules.dataset.output.data,
        policy=rules.policy.output.sha,
        reward=rules.reward.output.sha,
        envs=parity_inputs,
    output:
        directory(f"{RESULTS}/{layout.PARITY}"),
    log:
        f"{RESULTS}/logs/parity.log",
    conda:
        "../envs/harness.yaml"
    params:
        inputs=lambda w, input: os.path.dirname(input.dataset),
    shell:
        "remax-bench parity --config {input.config:q} --inputs {params.inputs:q} --out {output:q} > {log:q} 2>&1"
