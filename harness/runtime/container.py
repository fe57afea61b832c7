"""Apptainer images as the framework environments (`container.runtime: apptainer`), instead of the venvs.

Each framework environment NAME gets one image, results/images/NAME.sif, made once by the workflow's
framework_image rule (`remax-bench image NAME`) from the framework's published image (`container.images.NAME.from`):
pulled as published (`install: false`), or built from a definition generated here that installs the pinned
description of NAME (its framework's envs/NAME.txt) on top, with the same pip steps as the venv
(harness.runtime.envs.pip_steps), so a container and a venv hold the same versions. Beside the image, NAME.json
records where it came from and the sha256 of the .sif; the run manifest copies it. launch.sh runs the framework's
programs inside `apptainer exec --nv` (exec_prefix, used only through env_command below); the host environment passes
through (Apptainer's default), so launch.sh's exports, CUDA_VISIBLE_DEVICES and the scheduler's variables reach the
framework.
"""

from __future__ import annotations

import datetime as dt
import re
import subprocess
import unicodedata
from pathlib import Path

from harness import HarnessError
from harness.io import atomic_path, check_replaceable, read_json_object, sha256_file, write_json
from harness.results import layout
from harness.runtime import envs
from harness.runtime.launch_script import shell_word, shell_words

# Where a generated definition puts the description and setup scripts inside the image.
IN_IMAGE = "/opt/remax-bench"
# What build_image writes (harness.io.WRITTEN): the image, and its record beside it.
IMAGE_ROLE, IMAGE_RECORD_ROLE = "container image", "image record"
# The characters a path in a generated definition may hold. Apptainer reads the definition line by line (a newline
# in a path starts a section of its own, e.g. a %post that runs at build time), replaces {{ NAME }} with build
# arguments, splits a %files line at spaces outside double quotes (which cannot be escaped), and expands each source
# with `/bin/sh -c 'for n in SOURCE ; do printf "$n\0"; done'`, escaping only spaces (internal/pkg/build/files
# expandPath): a quote, `$`, a backquote, `;`, `*`, `%` or a backslash there would run or change the build.
DEFINITION_PATH = re.compile(r"[A-Za-z0-9/._+,:@= -]+")


def image_path(name: str) -> Path:
    return layout.path(layout.RESULTS, layout.IMAGE, env=name).absolute()


def record_path(name: str) -> Path:
    return layout.path(layout.RESULTS, layout.IMAGE_RECORD, env=name).absolute()


def image_settings(name: str, config: dict) -> dict:
    images = config["container"]["images"]
    if name not in images:
        raise HarnessError(f"config: at container.images: no image for environment {name!r} "
                           f"(configured: {', '.join(sorted(images))})")
    return images[name]


def binds(config: dict) -> list[str]:
    """Host paths the framework sees inside the container, at the same paths: the harness code (reward bridges,
    launchers, agents), results/ (inputs, plans, runs, the DeepSpeed-Chat checkout), the checkpoints the inputs link
    to, and container.binds. Resolved, since plans name resolved paths and inputs link to the checkpoints."""
    paths = [envs.REPO, Path(layout.RESULTS), config["policy"]["path"],
             config["reward"]["path"] if config["reward"]["kind"] == "model" else None, *config["container"]["binds"]]
    out = []
    for p in paths:
        if p is None:
            continue
        resolved = str(Path(p).resolve())
        if "," in resolved or ":" in resolved:
            raise HarnessError(f"config: {resolved}: apptainer --bind cannot take a path with ',' or ':'")
        if resolved not in out:
            out.append(resolved)
    return out


def exec_prefix(name: str, config: dict) -> list[str]:
    image_settings(name, config)
    return [config["container"]["apptainer"], "exec", "--nv", "--bind", ",".join(binds(config)),
            str(image_path(name))]


def launch_check(name: str, config: dict) -> str:
    """Bash lines for launch.sh: stop with exit 2 when apptainer or the image is missing on the node."""
    target = f"{layout.RESULTS}/{layout.IMAGE_RECORD.format(env=name)}"  # the Snakemake target that builds it
    return (f"APPTAINER={shell_word(config['container']['apptainer'])}\n"
            f"IMAGE={shell_word(str(image_path(name)))}\n"
            'if ! command -v "$APPTAINER" >/dev/null; then\n'
            '  echo "launch.sh: $APPTAINER not found (container.runtime is apptainer)" >&2\n  exit 2\nfi\n'
            'if [ ! -f "$IMAGE" ]; then\n'
            f"  echo \"launch.sh: no image at $IMAGE: build it with 'snakemake {target}'"
            f" (remax-bench image {name})\" >&2\n  exit 2\nfi\n")


def definition_path(path: str | Path, where: str) -> str:
    """`path` as a word of a definition's %files line; a HarnessError naming it (on one line) and `where` it comes
    from when Apptainer would read it as anything but that path."""
    text = str(path)
    if any(unicodedata.category(c) == "Cc" for c in text):
        raise HarnessError(f"{where}: {text!r} holds a control character (a newline would add a section to the "
                           "image's definition); rename the file")
    if not DEFINITION_PATH.fullmatch(text):
        odd = "".join(sorted(set(DEFINITION_PATH.sub("", text))))
        raise HarnessError(f"{where}: {text!r} holds {odd!r}, which apptainer build would read as definition or "
                           "shell syntax; rename the file (or move the repository) to a path of ASCII letters, "
                           "digits, spaces and /._+,:@=-")
    return f'"{text}"' if " " in text else text


def definition(name: str, settings: dict) -> str:
    """An Apptainer definition: the published image, less `uninstall`, plus the pinned description and `setup`."""
    bootstrap, _, ref = settings["from"].partition("://")
    spec = envs.spec_path(name)
    scripts = [envs.REPO / s for s in settings["setup"]]
    where = f"config: at container.images.{name}.setup"
    files = [(definition_path(spec, f"environment {name!r}"),
              definition_path(f"{IN_IMAGE}/{spec.name}", f"environment {name!r}"))]
    for script in scripts:
        files.append((definition_path(script, where), definition_path(f"{IN_IMAGE}/{script.name}", where)))
        if not script.is_file():
            raise HarnessError(f"{where}: {script} is not a file")
    pip = ["python3", "-m", "pip"]
    install = [*pip, "install", "--no-cache-dir", "--disable-pip-version-check"]
    post = [
        "set -eu",
        # NGC images constrain pip to their own torch build (PIP_CONSTRAINT); the pinned description decides here.
        "export PIP_CONSTRAINT=",
        *(f"export {k}={shell_word(v)}" for k, v in envs.install_env_vars(spec).items()),
        *([shell_words([*pip, "uninstall", "-y", *settings["uninstall"]])] if settings["uninstall"] else []),
        *(shell_words(cmd) for cmd in envs.pip_steps(spec, install, spec_as=f"{IN_IMAGE}/{spec.name}")),
        *(shell_words(["python3", f"{IN_IMAGE}/{s.name}"]) for s in scripts),
    ]
    return "\n".join([
        f"Bootstrap: {bootstrap}",
        f"From: {ref}",
        "",
        "%files",
        *(f"    {src} {dest}" for src, dest in files),
        "",
        "%post",
        *(f"    {line}" for line in post),
        "",
        "%labels",
        f"    remax-bench.env {name}",
        f"    remax-bench.description-sha256 {sha256_file(spec)}",
        "",
    ])


def build_command(name: str, settings: dict, apptainer: str, out: Path, definition_file: Path) -> list[str]:
    if settings["install"]:
        return [apptainer, "build", str(out), str(definition_file)]
    return [apptainer, "pull", str(out), settings["from"]]


def build_image(name: str, config: dict, out: str | Path | None = None) -> dict:
    """Pull or build the image of environment `name` into results/images/NAME.sif (or `out`) and write its record
    beside it; the .sif and the record appear only when apptainer succeeded."""
    settings = image_settings(name, config)
    apptainer = config["container"]["apptainer"]
    out = Path(out).absolute() if out else image_path(name)
    for dest, role in ((out, IMAGE_ROLE), (out.with_suffix(".json"), IMAGE_RECORD_ROLE)):  # before a build of minutes
        check_replaceable(dest, role=role)
    text = definition(name, settings) if settings["install"] else None
    try:
        version = subprocess.run([apptainer, "--version"], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError) as e:
        raise HarnessError(f"config: at container.apptainer: cannot run {apptainer!r} ({e}); install Apptainer "
                           "(https://apptainer.org) on the node that builds the images") from None
    with atomic_path(out, role=IMAGE_ROLE) as tmp:
        definition_file = tmp.with_suffix(".def")
        if text is not None:
            definition_file.write_text(text)
        cmd = build_command(name, settings, apptainer, tmp, definition_file)
        print("+", shell_words(cmd), flush=True)
        proc = subprocess.run(cmd)
        if proc.returncode or not tmp.is_file():
            raise HarnessError(f"{out}: {' '.join(cmd[:2])} of environment {name!r} failed (exit {proc.returncode}); "
                               "its output is above")
        digest = sha256_file(tmp)
    record = {
        "env": name, "from": settings["from"], "install": settings["install"], "uninstall": settings["uninstall"],
        "setup": settings["setup"], "definition": text,
        "description_sha256": sha256_file(envs.spec_path(name)) if settings["install"] else None,
        "sif": str(out), "sif_sha256": digest, "apptainer": version.stdout.strip(),
        "built": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }
    write_json(out.with_suffix(".json"), record, role=IMAGE_RECORD_ROLE)
    return record


def image_record(name: str) -> dict | None:
    """The record of environment `name`'s image, for the run manifest; None before the image is made."""
    path = record_path(name)
    return read_json_object(path, f"the {name} image's record") if path.is_file() else None


# ---- a framework environment's programs, under either runtime ------------------------------------------------

def env_command(name: str, config: dict, program: str = "python") -> list[str]:
    """The command that runs `program` of environment `name` as `container.runtime` says: the venv's own, or the
    image's inside `apptainer exec`. The one place a launch command's prefix is built; every adapter asks here."""
    if config["container"]["runtime"] == "apptainer":
        return [*exec_prefix(name, config), program]
    return [str(envs.ENV_ROOT / name / "bin" / program)]  # ENV_ROOT read now: tests point it elsewhere


def env_check(name: str, config: dict, program: str = "python") -> str:
    """Bash lines for launch.sh: stop with exit 2 and the command that builds the environment when it is missing;
    then give the environment its own cache of torch's JIT-built extensions (DeepSpeed's C++ ops).

    torch keeps one such cache per user, named by the Python and CUDA versions only (~/.cache/torch_extensions/
    py311_cpu on a CPU), so two environments with the same versions share it, and each rebuilds the other's ops
    (build.ninja names its own torch headers): on 2 cores about 30 s per op, at the start of every OpenRLHF or
    DeepSpeed-Chat run that follows the other framework's. A TORCH_EXTENSIONS_DIR already set is kept."""
    if config["container"]["runtime"] == "apptainer":
        return launch_check(name, config)
    return (f"ENV_PROGRAM={shell_word(env_command(name, config, program)[0])}\n"
            'if [ ! -x "$ENV_PROGRAM" ]; then\n'
            f"  echo \"launch.sh: no environment at $ENV_PROGRAM: build it with 'remax-bench env {name}'\" >&2\n"
            "  exit 2\nfi\n"
            'if [ -z "${TORCH_EXTENSIONS_DIR:-}" ]; then\n'
            f"  export TORCH_EXTENSIONS_DIR={shell_word(str(envs.ENV_ROOT / name / envs.TORCH_EXTENSIONS))}\nfi\n")
