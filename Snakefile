# remax-bench: ReMax across RL frameworks, one dataset, reward, initial policy and set of seeds.
from snakemake.utils import min_version

min_version("9.0")


configfile: "workflows/config/cpu.yaml"


report: "workflows/report/workflow.rst"


include: "workflows/rules/common.smk"
include: "workflows/rules/setup.smk"
include: "workflows/rules/inputs.smk"
include: "workflows/rules/preflight.smk"
include: "workflows/rules/plan.smk"
include: "workflows/rules/images.smk"
include: "workflows/rules/run.smk"
include: "workflows/rules/repeat.smk"
include: "workflows/rules/ingest.smk"
include: "workflows/rules/summarize.smk"
include: "workflows/rules/report.smk"
include: "workflows/rules/check.smk"
include: "workflows/rules/conformance.smk"
include: "workflows/rules/parity.smk"
include: "workflows/rules/ab.smk"
include: "workflows/rules/nightly.smk"


rule all:
    input:
        final_outputs(),


onstart:
    stop_without_scheduler()


onerror:
    report_what_finished()
