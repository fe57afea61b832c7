"""Code that runs inside OpenRLHF's own environment, never in the harness's: the ReMax agent, patch, greedy evaluation
and validation scripts (remax/), the CPU layer installed into .venvs/openrlhf-cpu (cpu/) and the vllm stand-in of the
CPU test environment (cpu_stubs/). The harness names these files by path and never imports them; they import the
standard library, OpenRLHF and its environment's packages, and of the harness only harness.reward and
harness.conformance (tests/test_code_style.py)."""
