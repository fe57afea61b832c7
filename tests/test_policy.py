import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from harness.config import validate_config
from harness.inputs.policy import encode_pairs, make_policy, token_logprobs
from harness.inputs.task import generate


def test_initial_policy_is_a_standard_checkpoint_with_a_local_tokenizer(tmp_path):
    config = validate_config({
        "task": {"n_train": 64, "n_eval": 8},
        "policy": {"hidden_size": 16, "intermediate_size": 32, "num_layers": 1, "num_heads": 2,
                   "sft": {"steps": 3, "batch_size": 8}},
    })
    rows = generate(config["task"])
    dataset = {s: [r for r in rows if r["split"] == s] for s in ("train", "eval")}
    record = make_policy(dataset, config, tmp_path / "policy")
    assert record["sft_steps"] == 3 and record["parameters"] > 0

    # what real frameworks do: Auto* classes from the directory
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "policy")
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "policy")
    assert model.config.model_type == "llama"
    ids = tokenizer("37+45=")["input_ids"]
    assert ids[0] == tokenizer.bos_token_id and len(ids) == 1 + 6  # one token per digit and symbol
    assert tokenizer.decode(ids, skip_special_tokens=True) == "37+45="
    chat = tokenizer.apply_chat_template([{"role": "user", "content": "37+45="}], tokenize=False)
    assert chat == "37+45="  # chat-format prompts render to the plain prompt, so all frameworks see the same text


def test_left_padding_does_not_change_log_probs(tmp_path):
    config = validate_config({"task": {"n_train": 64, "n_eval": 8},
                              "policy": {"hidden_size": 16, "intermediate_size": 32, "num_layers": 1,
                                         "num_heads": 2, "sft": {"steps": 1, "batch_size": 8}}})
    rows = generate(config["task"])
    make_policy({s: [r for r in rows if r["split"] == s] for s in ("train", "eval")}, config, tmp_path / "p")
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "p").eval()
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "p")
    alone = encode_pairs(tokenizer, ["5+7="], ["12"])
    padded = encode_pairs(tokenizer, ["5+7=", "55+77="], ["12", "132"])
    with torch.no_grad():
        lp_alone = token_logprobs(model, *alone[:2])[0][alone[2][0].bool()]
        lp_padded = token_logprobs(model, *padded[:2])[0][padded[2][0].bool()]
    assert torch.allclose(lp_alone, lp_padded, atol=1e-5)
