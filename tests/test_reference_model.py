"""The reference backend's decoder against the Transformers model it is packed from: same log-probs, same gradients,
same greedy responses; prompts shared by their responses; a model outside the Llama family refused by name."""

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from harness import HarnessError, remax
from harness.frameworks.reference.model import Decoder, generate, response_logprobs
from harness.inputs.policy import token_logprobs

EOS, PAD = 2, 0
SMALL = dict(vocab_size=40, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
             max_position_embeddings=64, bos_token_id=1, eos_token_id=EOS, pad_token_id=PAD)
MODELS = {
    # grouped-query attention, untied head, llama3 rope scaling: what the packing must carry over as it is
    "llama": lambda: LlamaForCausalLM(LlamaConfig(**SMALL, num_key_value_heads=2, tie_word_embeddings=False,
                                                  rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                                                "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                                "original_max_position_embeddings": 16})),
    # q/k/v biases and a tied head, as Qwen2.5 checkpoints have
    "qwen2": lambda: Qwen2ForCausalLM(Qwen2Config(**SMALL, num_key_value_heads=4, tie_word_embeddings=True)),
}


def prompts(rows=3, width=5):
    """Left-padded prompts of different lengths (the first row is the longest)."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, SMALL["vocab_size"], (rows, width), generator=g)
    attn = torch.ones(rows, width, dtype=torch.long)
    for row in range(1, rows):
        attn[row, :row] = 0
        ids[row, :row] = PAD
    return ids, attn


@pytest.fixture(params=sorted(MODELS))
def model(request):
    torch.manual_seed(0)
    return MODELS[request.param]().eval()


def test_log_probs_and_gradients_equal_the_transformers_model(model):
    ids, attn = prompts()
    n, response = 2, torch.randint(3, SMALL["vocab_size"], (6, 4), generator=torch.Generator().manual_seed(1))
    response[0, 2:] = torch.tensor([EOS, PAD])
    mask = remax.response_mask(response, EOS)
    full_ids = torch.cat([ids.repeat_interleave(n, 0), response], 1)
    full_attn = torch.cat([attn.repeat_interleave(n, 0), mask.long()], 1)
    theirs = token_logprobs(model, full_ids, full_attn)[:, ids.shape[1] - 1:]
    decoder = Decoder(model)
    ours = response_logprobs(decoder, ids, attn, response, n)
    assert torch.allclose(ours * mask, theirs * mask, atol=1e-5)

    # The trainer is a Decoder: its packed gradients must be the model's gradients, stacked the same way.
    (theirs * mask).sum().backward()
    (ours * mask).sum().backward()
    layer, packed = model.model.layers[1], decoder.layers[1]
    attn_grad = torch.cat([layer.self_attn.q_proj.weight.grad, layer.self_attn.k_proj.weight.grad,
                           layer.self_attn.v_proj.weight.grad])
    assert torch.allclose(packed["qkv"].grad, attn_grad, atol=1e-5)
    mlp_grad = torch.cat([layer.mlp.gate_proj.weight.grad, layer.mlp.up_proj.weight.grad])
    assert torch.allclose(packed["gate_up"].grad, mlp_grad, atol=1e-5)
    assert torch.allclose(decoder.embed.grad, model.model.embed_tokens.weight.grad, atol=1e-5)


def test_responses_of_one_token_each_are_scored(model):
    # a batch in which every response is EOS at once (a policy pushed there, as with the KL term's sign flipped in
    # benchmarks/reproduce_power.py) is one token wide: nothing after the prompt's last position to decode
    ids, attn = prompts()
    response = torch.full((6, 1), EOS)
    theirs = token_logprobs(model, torch.cat([ids.repeat_interleave(2, 0), response], 1),
                            torch.cat([attn.repeat_interleave(2, 0), torch.ones_like(response)], 1))[:, -1:]
    assert torch.allclose(response_logprobs(Decoder(model), ids, attn, response, 2), theirs, atol=1e-5)


def test_greedy_rows_are_transformers_greedy_and_sampled_rows_follow_their_prompt(model):
    ids, attn = prompts()
    decoder = Decoder(model)
    out = generate(decoder, ids, attn, n=3, greedy=True, max_new_tokens=6, temperature=1.0, top_p=1.0,
                   eos_id=EOS, pad_id=PAD)
    assert out.shape[0] == 3 * 3 + 3 and out.shape[1] <= 6
    expected = model.generate(input_ids=ids, attention_mask=attn, do_sample=False, max_new_tokens=6,
                              pad_token_id=PAD, eos_token_id=EOS)[:, ids.shape[1]:]
    assert torch.equal(out[9:, :expected.shape[1]], expected)
    # A nucleus holding only the most likely token makes a sampled row its prompt's greedy row: rows are in prompt
    # order, each prompt's n together, and share that prompt's cached keys and values.
    narrow = generate(decoder, ids, attn, n=3, greedy=False, max_new_tokens=6, temperature=1.0, top_p=1e-6,
                      eos_id=EOS, pad_id=PAD)
    assert torch.equal(narrow[:, :expected.shape[1]], expected.repeat_interleave(3, 0)[:, :narrow.shape[1]])
    # After a row's EOS, only padding.
    ended = (out == EOS).long().cumsum(1) - (out == EOS).long()
    assert (out[ended > 0] == PAD).all()


def test_fixed_length_masks_eos_until_the_length_as_transformers_min_new_tokens(model):
    """remax.generation_length fixed: every row runs to max_new_tokens with no EOS, and the greedy rows are what
    Transformers' min_new_tokens (the mask vLLM's min_tokens applies too) decodes; natural rows do end at EOS."""
    ids, attn = prompts()
    decoder = Decoder(model)

    def responses(min_new_tokens):
        torch.manual_seed(3)
        return generate(decoder, ids, attn, n=8, greedy=True, max_new_tokens=12, temperature=1.0, top_p=1.0,
                        eos_id=EOS, pad_id=PAD, min_new_tokens=min_new_tokens)
    natural, fixed = responses(0), responses(12)
    assert (natural == EOS).any(1).sum() > 0, "no natural row ended at EOS: the case shows nothing"
    assert fixed.shape == (3 * 8 + 3, 12) and not (fixed == EOS).any()
    expected = model.generate(input_ids=ids, attention_mask=attn, do_sample=False, max_new_tokens=12,
                              min_new_tokens=12, pad_token_id=PAD, eos_token_id=EOS)[:, ids.shape[1]:]
    assert torch.equal(fixed[24:], expected)


def test_half_precision_weights_decode_and_score_in_their_dtype():
    # GPU profiles load checkpoints in bfloat16: rotary tables and attention must stay in the weights' dtype.
    torch.manual_seed(0)
    decoder = Decoder(MODELS["qwen2"]().to(torch.bfloat16).eval())
    ids, attn = prompts()
    out = generate(decoder, ids, attn, n=2, greedy=True, max_new_tokens=4, temperature=1.0, top_p=0.9,
                   eos_id=EOS, pad_id=PAD)
    logprobs = response_logprobs(decoder, ids, attn, out[:6], 2)
    assert logprobs.dtype == torch.float32 and torch.isfinite(logprobs).all()


def test_a_model_outside_the_llama_family_is_refused_by_name():
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=40, n_embd=16, n_layer=1, n_head=2, n_positions=16))
    with pytest.raises(HarnessError, match="model_type 'gpt2' is not one of llama, qwen2"):
        Decoder(gpt2)
