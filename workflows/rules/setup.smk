# Framework sources that are not packages (an adapter's `checkout`), checked out at a pinned commit on the machine
# that runs them: one rule per framework, NAME_checkout, making config[NAME]["checkout"].
# Needs common.smk (config, RESULTS); a run of the framework lists its checkout among its inputs (framework_sources).
import json

from harness.frameworks import get_adapter, known_frameworks, refuse_foreign_checkout
from harness.io import OWNER
from harness.results.layout import checkout_owner


for fw in [name for name in known_frameworks() if get_adapter(name).checkout is not None]:
    refuse_foreign_checkout(fw, config)  # before Snakemake deletes a folder the rule did not make
    sparse = " && git -C {output:q} sparse-checkout set {params.folders:q}" if get_adapter(fw).checkout.folders else ""

    rule:
        name:
            f"{fw}_checkout"
        input:
            preflight_gate,
        output:
            directory(config[fw]["checkout"]),
        log:
            f"{RESULTS}/{layout.CHECKOUT_LOG.format(framework=fw)}",
        conda:
            "../envs/git.yaml"
        params:
            repository=config[fw]["repository"],
            commit=get_adapter(fw).checkout.commit,
            folders=list(get_adapter(fw).checkout.folders),
            owner=json.dumps(checkout_owner(fw), sort_keys=True),
            owner_file=OWNER,
        shell:
            "(git init -q {output:q}"
            " && git -C {output:q} remote add origin {params.repository:q}"
            + sparse
            + " && git -C {output:q} fetch -q --depth 1 origin {params.commit:q}"
            " && git -C {output:q} checkout -q FETCH_HEAD"
            ' && test "$(git -C {output:q} rev-parse HEAD)" = {params.commit:q}'
            " && printf '%s\\n' {params.owner:q} > {output:q}/{params.owner_file:q}) > {log:q} 2>&1"
