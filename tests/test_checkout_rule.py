"""The DeepSpeed-Chat checkout rule (workflows/rules/setup.smk) never deletes a folder it did not make: Snakemake
removes a directory() output before its job runs, so a dschat.checkout naming a folder of the user's stops the
workflow when it loads, naming the key, and the rule marks the checkouts it makes as its own (harness.io.OWNER).

Real Snakemake runs; `git` is a stand-in (no network here) that checks out nothing and answers for the pinned commit
only in a folder with a .git."""

import json
import os

import pytest
import yaml
from conftest import snakemake

from harness import HarnessError
from harness.config import load_config
from harness.frameworks import refuse_foreign_checkout
from harness.frameworks.dschat.plan import REMAX_COMMIT
from harness.io import OWNER

GIT = f"""#!/bin/sh
while [ "$1" = -c ]; do shift 2; done  # the settings the harness puts first (harness/runtime/git.py)
case "$*" in
  "init -q "*) mkdir -p "$3/.git" ;;
  *rev-parse*) [ -e "$2/.git" ] && echo {REMAX_COMMIT} ;;
esac
exit 0
"""


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "git").write_text(GIT)
    (bin_dir / "git").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    work = tmp_path / "work"
    work.mkdir()
    return work


def config(workdir, checkout):
    path = workdir / "c.yaml"
    path.write_text(yaml.safe_dump({"frameworks": ["reference", "dschat"], "launch": {"device": "cpu"},
                                    "dschat": {"checkout": str(checkout)}}))
    return path


def test_a_folder_of_the_users_is_refused_naming_the_key_and_kept(workdir, tmp_path):
    """The reported case, as it ran: a forced run of the rule deleted the folder and exited 0."""
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("my notes\n")
    proc = snakemake(workdir, "--cores", "1", "-f", mine, "--configfile", config(workdir, mine))
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    assert f"config: at dschat.checkout: {mine} is a folder that is not empty and not a checkout" in out
    assert (mine / "notes.txt").read_text() == "my notes\n"


def refused(workdir, checkout) -> str:
    """What the workflow says as it loads (the check the test above runs under Snakemake), in this process."""
    with pytest.raises(HarnessError) as err:
        refuse_foreign_checkout("dschat", load_config(config(workdir, checkout)))
    return str(err.value)


def test_a_file_named_as_the_checkout_is_refused_and_kept(workdir, tmp_path):
    mine = tmp_path / "notes.txt"
    mine.write_text("my notes\n")
    assert refused(workdir, mine).startswith(f"config: at dschat.checkout: {mine} is a file")
    assert mine.read_text() == "my notes\n"


def test_a_pinned_checkout_the_harness_did_not_mark_is_refused_saying_what_to_do(workdir, tmp_path):
    """A checkout made by hand, or by the rule before it marked its checkouts: refused too, since a rerun of the rule
    (a new pinned commit) would delete it; the message says how to go on."""
    old = tmp_path / "ReMax"
    (old / ".git").mkdir(parents=True)
    (old / "README.md").write_text("ReMax\n")
    said = refused(workdir, old)
    assert f"config: at dschat.checkout: {old} is a git checkout of the pinned commit {REMAX_COMMIT[:7]}" in said
    assert "remove the folder (the workflow checks it out again, as its own)" in said
    assert (old / "README.md").is_file()


def test_the_rule_checks_out_into_an_empty_folder_and_marks_it_as_its_own(workdir, tmp_path):
    checkout = tmp_path / "src" / "ReMax"
    checkout.mkdir(parents=True)
    cfg = config(workdir, checkout)
    proc = snakemake(workdir, "--cores", "1", checkout, "-f", "--configfile", cfg)  # an existing output is up to date
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert json.loads((checkout / OWNER).read_text()) == {"kind": "checkout", "framework": "dschat"}
    # the rule's own checkout, with files a run left in it, may be replaced when the rule runs again
    (checkout / "build.log").write_text("")
    proc = snakemake(workdir, "-n", "-f", checkout, "--configfile", cfg)
    assert proc.returncode == 0 and "rule dschat_checkout:" in proc.stdout, proc.stdout[-3000:] + proc.stderr


def test_a_brace_in_the_checkout_is_refused_naming_the_key(workdir, tmp_path):
    """A {word} in the rule's directory() output was a Snakemake RuleException about wildcards, naming no key."""
    checkout = tmp_path / "src" / "{x}"
    proc = snakemake(workdir, "-n", "--configfile", config(workdir, checkout))
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    assert f"config: at dschat.checkout: {str(checkout)!r} holds a brace" in out, out[-3000:]
    assert "RuleException" not in out and "wildcard" not in out.replace("as a wildcard", ""), out[-3000:]
    assert not (tmp_path / "src").exists()
