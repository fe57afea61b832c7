"""Stand-in for flash_attn (CUDA-only): the names OpenRLHF 0.11.2 binds at import (models/ring_attn_utils.py, reached
from cli/train_ppo_ray.py). OpenRLHF calls them only for packed samples (models/actor.py: --ds.packing_samples,
--train.dynamic_batch_enable, ring attention), which no CPU plan turns on. Installed into .venvs/openrlhf-cpu (and put
on the path of the validation environment); never into a GPU environment, which has the real package.

A call is a bug in the plan, not a fallback: it raises, and the ingest refuses a log that shows it (STAND_IN_CALLED).
Not provided: flash_attn.ops.triton.cross_entropy, since models/utils.py falls back to plain torch only on ImportError.
"""

STAND_IN_CALLED = "remax-bench flash_attn stand-in called"


def gpu_only(name):
    def call(*args, **kwargs):
        raise NotImplementedError(f"{STAND_IN_CALLED}: flash_attn.{name} (CUDA-only; reached only with packed "
                                  "samples, which a CPU plan never enables)")
    call.__name__ = name.rpartition(".")[2]
    return call
