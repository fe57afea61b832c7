"""remax-bench: run ReMax across RL frameworks and compare them in one schema."""

__version__ = "0.1.0"


class HarnessError(Exception):
    """Bad input (config, log, baseline, input file): the message names what and where.

    The CLI prints it and exits 2; nothing downstream treats a partial output as complete.
    """
