"""Code that runs inside TRL's own environment, never in the harness's: the ReMax trainer (remax_trl.py) and the
conformance driver (conformance_driver.py). The harness names these files by path and never imports them; they import
the standard library, TRL and its environment's packages, and of the harness only harness.reward and
harness.conformance (tests/test_code_style.py)."""
