"""Stand-in for flash_attn.utils.distributed (see flash_attn/__init__.py)."""

from flash_attn import gpu_only

all_gather = gpu_only("utils.distributed.all_gather")
