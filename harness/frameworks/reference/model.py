"""The reference backend's model: a Llama-family decoder in a few functions over packed weights.

Why not the Transformers model itself: a ReMax step is many short responses to few prompts, and a general model
repeats most of its work there. Each prompt is sampled n times and decoded once more greedily, and the reference
and trainer forwards see every prompt n times again. Here a prompt runs once and its keys and values are shared by
all its responses (prefix sharing, as vLLM and SGLang do for parallel sampling), greedy rows decode in the same
batch as the sampled ones (argmax instead of a draw), and q/k/v and gate/up are one matmul each, as inference
engines pack them. The weights come from the same checkpoint and the logits equal the Transformers model's
(tests/test_reference_model.py); the trainer is a Decoder too, so an update moves the same packed tensors that
the rollout model receives in the transition.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeAlias, cast

import torch
import torch.nn.functional as F

from harness import HarnessError
from harness.inputs.policy import position_ids

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedModel

# Decoders whose layers are exactly: RMSNorm, rotary attention (grouped-query, optional q/k/v/o biases), RMSNorm,
# SiLU-gated MLP (optional biases). Mistral-style sliding windows are not implemented.
FAMILY = ("llama", "qwen2")

# Per layer of a Transformers model: packed name -> the modules whose weights (and biases) are stacked into it.
_PACKING = {
    "qkv": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "o": ("self_attn.o_proj",),
    "gate_up": ("mlp.gate_proj", "mlp.up_proj"),
    "down": ("mlp.down_proj",),
}

# What `Decoder.forward` returns beside the logits and takes back as `past`: per layer (keys, values), and which of
# its positions are real tokens.
Context: TypeAlias = tuple[list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor]


def _check_family(config: PretrainedConfig) -> None:
    if config.model_type not in FAMILY:
        problems = [f"model_type {config.model_type!r} is not one of {', '.join(FAMILY)}"]
    else:
        problems = (["sliding-window attention"] if getattr(config, "use_sliding_window", False) else []) + (
            [f"hidden_act {config.hidden_act!r} (not silu)"] if config.hidden_act != "silu" else [])
    if problems:
        raise HarnessError(f"policy: the reference backend's decoder (harness.frameworks.reference.model) "
                           f"implements the Llama family only: {'; '.join(problems)}")


class Decoder(torch.nn.Module):
    """Packed copy of a Transformers Llama-family causal LM; `forward` runs new tokens against cached ones."""

    inv_freq: torch.Tensor

    def __init__(self, model: PreTrainedModel) -> None:
        super().__init__()
        config = model.config
        _check_family(config)
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.eps = config.rms_norm_eps
        base = model.model
        # Transformers derives inv_freq (and a cos/sin scale) from the config's rope type; reusing them keeps every
        # rope variant it knows (linear, dynamic, llama3, yarn at load length) without naming them here.
        self.register_buffer("inv_freq", base.rotary_emb.inv_freq.detach().clone(), persistent=False)
        self.rope_scale = float(base.rotary_emb.attention_scaling)

        def param(*tensors: torch.Tensor) -> torch.nn.Parameter:
            return torch.nn.Parameter(torch.cat([t.detach() for t in tensors]).clone())

        self.embed = param(base.embed_tokens.weight)
        self.head = None if config.tie_word_embeddings else param(model.lm_head.weight)
        self.norm = param(base.norm.weight)
        self.layers = torch.nn.ModuleList()
        for layer in base.layers:
            packed = torch.nn.ParameterDict({"norm_attn": param(layer.input_layernorm.weight),
                                             "norm_mlp": param(layer.post_attention_layernorm.weight)})
            for name, paths in _PACKING.items():
                modules = [layer.get_submodule(p) for p in paths]
                packed[name] = param(*(m.weight for m in modules))
                if modules[0].bias is not None:
                    packed[name + "_bias"] = param(*(m.bias for m in modules))
            self.layers.append(packed)

    def _rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # Angles in float32 whatever the weights' dtype, then cast, as Transformers does.
        freqs = positions[..., None].float() * self.inv_freq
        angles = torch.cat((freqs, freqs), -1)[:, :, None]
        dtype = self.embed.dtype
        return (angles.cos() * self.rope_scale).to(dtype), (angles.sin() * self.rope_scale).to(dtype)

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, valid: torch.Tensor, past: Context | None = None,
                last_only: bool = False) -> tuple[torch.Tensor, Context]:
        """Logits of `tokens` (rows, T), or of the last of them only (`last_only`), and the context after them.

        The new tokens attend causally among themselves and to every valid token of `past` (the context an earlier
        call returned: per layer keys and values, and which of its positions are real tokens, not padding).
        `valid` marks the new tokens that are real. A context is (list of (keys, values) per layer, valid)."""
        rows, width = tokens.shape
        past_kv, past_valid = past if past is not None else ([None] * len(self.layers), valid[:, :0])
        keys_valid = torch.cat([past_valid, valid], 1)
        causal = torch.ones(width, width, dtype=torch.bool, device=tokens.device).tril()
        mask = keys_valid[:, None, None, :] & torch.cat(
            [causal.new_ones(width, past_valid.shape[1]), causal], 1)
        # A padding query that sees no real token would get a softmax over nothing (NaN); let it see itself.
        mask[..., past_valid.shape[1]:] |= torch.eye(width, dtype=torch.bool, device=tokens.device)
        cos, sin = self._rope(positions)
        h = F.embedding(tokens, self.embed)
        kv = []
        for layer, cached in zip(cast("list[torch.nn.ParameterDict]", self.layers), past_kv):
            x = F.rms_norm(h, h.shape[-1:], layer["norm_attn"], self.eps)
            qkv = F.linear(x, layer["qkv"], layer.get("qkv_bias")).view(rows, width, -1, self.head_dim)
            rotated = self.heads + self.kv_heads  # queries and keys, rotated together
            q, k = _rotate(qkv[:, :, :rotated], cos, sin).transpose(1, 2).split([self.heads, self.kv_heads], 1)
            v = qkv[:, :, rotated:].transpose(1, 2)
            if cached is not None:
                k, v = torch.cat([cached[0], k], 2), torch.cat([cached[1], v], 2)
            kv.append((k, v))
            attn = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=self.kv_heads != self.heads)
            h = h + F.linear(attn.transpose(1, 2).reshape(rows, width, -1), layer["o"], layer.get("o_bias"))
            x = F.rms_norm(h, h.shape[-1:], layer["norm_mlp"], self.eps)
            gate, up = F.linear(x, layer["gate_up"], layer.get("gate_up_bias")).chunk(2, -1)
            h = h + F.linear(F.silu(gate) * up, layer["down"], layer.get("down_bias"))
        h = F.rms_norm(h[:, -1:] if last_only else h, h.shape[-1:], self.norm, self.eps)
        return F.linear(h, self.embed if self.head is None else self.head), (kv, keys_valid)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, -1)
    return x * cos + torch.cat((-x2, x1), -1) * sin


def _take(context: Context, rows: torch.Tensor) -> Context:
    """The context of each of `rows` (indices of the rows it was computed for): a prompt's keys and values, shared."""
    kv, valid = context
    return [(k[rows], v[rows]) for k, v in kv], valid[rows]


def _prefill(decoder: Decoder, ids: torch.Tensor, attn: torch.Tensor,
             rows: torch.Tensor) -> tuple[torch.Tensor, Context, torch.Tensor]:
    """Run each prompt once; return, per row of `rows` (prompt indices), its last logits, context and next position."""
    positions = position_ids(attn)
    logits, context = decoder(ids, positions, attn.bool(), last_only=True)
    return logits[rows, -1], _take(context, rows), positions[rows, -1] + 1


@torch.no_grad()
def generate(decoder: Decoder, ids: torch.Tensor, attn: torch.Tensor, *, n: int, greedy: bool, max_new_tokens: int,
             temperature: float, top_p: float, eos_id: int, pad_id: int, min_new_tokens: int = 0) -> torch.Tensor:
    """Responses to left-padded prompts: n sampled per prompt (rows in prompt order, each prompt's n together), then
    one greedy response per prompt when `greedy`. Tokens after a row's EOS are `pad_id`; decoding stops when every
    row has ended or after max_new_tokens. EOS cannot be drawn before min_new_tokens (vLLM's min_tokens, HF's
    min_new_tokens): min_new_tokens = max_new_tokens gives fixed-length responses. Returns (rows, width) token ids."""
    prompts = torch.arange(len(ids), device=ids.device)
    rows = torch.cat([prompts.repeat_interleave(n), prompts if greedy else prompts[:0]])
    is_greedy = torch.arange(len(rows), device=ids.device) >= len(prompts) * n
    logits, context, position = _prefill(decoder, ids, attn, rows)
    ended = torch.zeros(len(rows), dtype=torch.bool, device=ids.device)
    tokens = []
    for step in range(max_new_tokens):
        if step < min_new_tokens:
            logits = logits.clone()
            logits[:, eos_id] = float("-inf")
        token = torch.where(is_greedy, logits.argmax(-1), _sample(logits, temperature, top_p))
        token = torch.where(ended, pad_id, token)
        tokens.append(token)
        ended |= token == eos_id
        if ended.all() or step == max_new_tokens - 1:
            break
        logits, context = decoder(token[:, None], position[:, None], torch.ones_like(ended[:, None]), context)
        logits, position = logits[:, -1], position + 1
    return torch.stack(tokens, 1)


def _sample(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """One draw per row from softmax(logits / temperature), cut to the top-p nucleus (as HF's TopPLogitsWarper)."""
    probs = torch.softmax(logits.float() / temperature, -1)
    if top_p < 1.0:
        sorted_probs, order = probs.sort(-1, descending=True)
        sorted_probs[sorted_probs.cumsum(-1) - sorted_probs > top_p] = 0.0
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
    return torch.multinomial(probs, 1).squeeze(-1)


def response_logprobs(decoder: Decoder, ids: torch.Tensor, attn: torch.Tensor, response: torch.Tensor,
                      n: int) -> torch.Tensor:
    """log p(response[:, t] | prompt, response[:, :t]) for responses to left-padded prompts, n per prompt in
    prompt order (as `generate` returns them); each prompt runs once. Shape of `response`; differentiable."""
    rows = torch.arange(len(ids), device=ids.device).repeat_interleave(n)
    first, context, position = _prefill(decoder, ids, attn, rows)
    width = response.shape[1]
    logits = first[:, None]
    if width > 1:  # a batch whose every response is one token (EOS first) has nothing after it to decode
        rest, _ = decoder(response[:, :-1], position[:, None] + torch.arange(width - 1, device=ids.device),
                          torch.ones_like(response[:, :-1], dtype=torch.bool), context)
        logits = torch.cat([logits, rest], 1)
    return torch.log_softmax(logits.float(), -1).gather(-1, response[..., None]).squeeze(-1)


def unpacked(decoder: Decoder, model: PreTrainedModel) -> dict[str, torch.Tensor]:
    """The decoder's weights under the Transformers model's own names and shapes (`model`: the checkpoint it was
    packed from, or one of the same config), the inverse of the packing in Decoder.__init__: a checkpoint
    (save_pretrained) of a trained decoder, and the names every framework's weights are compared under."""
    names = dict(model.named_parameters())
    out = {"model.embed_tokens.weight": decoder.embed, "model.norm.weight": decoder.norm}
    if decoder.head is not None:
        out["lm_head.weight"] = decoder.head
    for i, packed in enumerate(cast("list[torch.nn.ParameterDict]", decoder.layers)):
        prefix = f"model.layers.{i}."
        out[prefix + "input_layernorm.weight"] = packed["norm_attn"]
        out[prefix + "post_attention_layernorm.weight"] = packed["norm_mlp"]
        for name, paths in _PACKING.items():
            for kind in ("weight", "bias"):
                if (name if kind == "weight" else name + "_bias") not in packed:
                    continue
                parts = packed[name if kind == "weight" else name + "_bias"].split(
                    [names[f"{prefix}{p}.{kind}"].shape[0] for p in paths])
                out.update({f"{prefix}{p}.{kind}": t for p, t in zip(paths, parts)})
    return {k: v.detach().clone() for k, v in out.items()}
