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
        folders=list(REMAX_FOLDERS),
    shell:
        "(git init -q {output:q}"
        " && git -C {output:q} remote add origin {params.repository:q}"
        " && git -C {output:q} sparse-checkout set {params.folders:q}"
        " && git -C {output:q} fetch -q --depth 1 origin {params.commit:q}"
        " && git -C {output:q} checkout -q FETCH_HEAD"
        ' && test "$(git -C {output:q} rev-parse HEAD)" = {params.commit:q}) > {log:q} 2>&1'

