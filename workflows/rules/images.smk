# Apptainer images as the framework environments (container.runtime: apptainer; harness/runtime/container.py). Each is
# made once, by this rule, and reused by every run of that framework; a change of its container.images settings
# or of the pinned description it installs makes it again. Needs common.smk (config, RESULTS).


rule framework_image:
    input:
        image_inputs,
    output:
        sif=f"{RESULTS}/{layout.IMAGE}",
        record=f"{RESULTS}/{layout.IMAGE_RECORD}",
    log:
        f"{RESULTS}/{layout.IMAGE_LOG}",
    wildcard_constraints:
        env="|".join(config["container"]["images"]),
    conda:
        "../envs/harness.yaml"
    params:
        settings=image_settings_json,
    threads: 8  # pip builds from source where no wheel matches (flash-attn)
    resources:
        mem_mb=32000,
        disk_mb=100000,  # the base image's layers, the build sandbox and the .sif
        runtime=240,
    shell:
        "remax-bench image {wildcards.env:q} --json {params.settings:q} --out {output.sif:q} > {log:q} 2>&1"
