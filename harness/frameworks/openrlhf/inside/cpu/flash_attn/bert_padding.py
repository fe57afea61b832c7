"""Stand-in for flash_attn.bert_padding (see flash_attn/__init__.py)."""

from flash_attn import gpu_only

index_first_axis = gpu_only("bert_padding.index_first_axis")
pad_input = gpu_only("bert_padding.pad_input")
rearrange = gpu_only("bert_padding.rearrange")
unpad_input = gpu_only("bert_padding.unpad_input")
