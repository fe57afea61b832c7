"""Code that runs inside DeepSpeed-Chat's own environment, never in the harness's: the launcher (launcher.py) with its
reward client (reward_client.py), and the conformance driver (conformance_driver.py). The harness names these files by
path and never imports them (the plan reads the launcher's constants from its source); they import the standard
library, DeepSpeed, the ReMax checkout and their environment's packages, and of the harness only harness.reward and
harness.conformance (tests/test_code_style.py)."""
