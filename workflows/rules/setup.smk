# Framework sources that are not packages: checked out at a pinned commit on the machine that runs them.
# Needs common.smk (config, RESULTS); a DeepSpeed-Chat run lists config["dschat"]["checkout"] among its inputs.
from harness.frameworks.dschat import REMAX_COMMIT, REMAX_FOLDERS


rule dschat_checkout:
    input:
        preflight_gate,
    output:
        directory(config["dschat"]["checkout"]),
    log:
        f"{RESULTS}/{layout.CHECKOUT_LOG.format(framework='dschat')}",
    conda:
        "../envs/git.yaml"
    params:
        repository=config["dschat"]["repository"],
        commit=REMAX_COMMIT,
        folders=" ".join(REMAX_FOLDERS),
    shell:
        "(git init -q {output}"
        " && git -C {output} remote add origin {params.repository:q}"
        " && git -C {output} sparse-checkout set {params.folders}"
        " && git -C {output} fetch -q --depth 1 origin {params.commit}"
        " && git -C {output} checkout -q FETCH_HEAD"
        ' && test "$(git -C {output} rev-parse HEAD)" = {params.commit}) > {log} 2>&1'

