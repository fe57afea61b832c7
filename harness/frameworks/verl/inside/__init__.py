"""Code that runs inside verl's own environment, never in the harness's: the reward function verl loads by path
(reward_function.py), the conformance driver (conformance_driver.py) and the CPU layer installed into .venvs/verl-cpu
(cpu/). The harness names these files by path and never imports them; they import the standard library, verl and its
environment's packages, and of the harness only harness.reward and harness.conformance (tests/test_code_style.py)."""
