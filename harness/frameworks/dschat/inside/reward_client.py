"""The shared reward where DeepSpeed-Chat runs: in place of its reward engine during training (SharedReward), and
for the greedy evaluation of the initial and the saved actor after main.py (greedy_evaluation).

Part of the launcher (launcher.py), in DeepSpeed-Chat's environment: the launcher imports it by its file name (the
launcher's folder, the script's own, is on sys.path where it runs) after making the harness checkout importable for
`harness.reward`, the one harness module used here.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness import reward as shared_reward

if TYPE_CHECKING:  # the dschat environment's packages, for annotations only: nothing here is imported at run time
    import torch
    from transformers import PreTrainedTokenizerBase

    from harness.frameworks.dschat.inside.launcher import StepRecorder


def normalize_prompt(text: str) -> str:
    return " ".join(text.split())


def response_lengths(response: torch.Tensor, stop_ids: set[int]) -> list[int]:
    """Tokens of each response up to and including the first EOS/pad (as DeepSpeed-Chat's action mask counts them)."""
    out = []
    for row in response.tolist():
        n = next((i + 1 for i, t in enumerate(row) if t in stop_ids), len(row))
        out.append(n)
    return out


class SharedReward:
    """Stands in for DeepSpeed-Chat's reward engine: `forward_value(...)["chosen_end_scores"]` is the shared reward."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, dataset_path: str | os.PathLike, recorder: StepRecorder,
                 reward_url: str | None) -> None:
        self.tokenizer = tokenizer
        self.recorder = recorder
        self.reward_url = reward_url
        self.answers: dict[str, tuple[str, str]] = {}
        with open(dataset_path) as f:
            for line in f:
                row = json.loads(line)
                self.answers[normalize_prompt(row["prompt"])] = (row["prompt"], row["answer"])

    def eval(self) -> SharedReward:
        return self

    def train(self, mode: bool = True) -> SharedReward:
        return self

    def forward_value(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, prompt_length: int = 0,
                      **_: Any) -> dict[str, torch.Tensor]:
        import torch

        pad = self.tokenizer.pad_token_id
        stops = {pad, self.tokenizer.eos_token_id} - {None}
        prompts, responses, answers = [], [], []
        for row in input_ids.tolist():
            prompt_ids = row[:prompt_length]
            while prompt_ids and prompt_ids[0] == pad:  # DeepSpeed-Chat left-pads prompts with the pad token
                prompt_ids = prompt_ids[1:]
            text = self.tokenizer.decode(prompt_ids, skip_special_tokens=True)
            try:
                prompt, answer = self.answers[normalize_prompt(text)]
            except KeyError:
                raise RuntimeError(f"shared reward: prompt {text!r} is not in the shared dataset; "
                                   "cannot score its response") from None
            response_ids = row[prompt_length:]
            n = response_lengths(torch.tensor([response_ids]), stops)[0]
            prompts.append(prompt)
            answers.append(answer)
            responses.append(self.tokenizer.decode(response_ids[:n], skip_special_tokens=True))
        scores = self._score(prompts, responses, answers)
        # In a training iteration generate_experience scores the samples first, then the greedy responses.
        w = self.recorder.window
        if w is not None:
            key = ("reward_sum", "n_rewards") if w["reward_calls"] == 0 else ("baseline_sum", "n_baselines")
            self.recorder.add(key[0], sum(scores))
            self.recorder.add(key[1], len(scores))
            w["reward_calls"] += 1
        return {"chosen_end_scores": torch.tensor(scores, dtype=torch.float32, device=input_ids.device)}

    def _score(self, prompts: list[str], responses: list[str], answers: list[str]) -> list[float]:
        return shared_reward.score_batch(prompts, responses, answers, self.reward_url)


def greedy_evaluation(main_args: list[str], dataset: str, reward_url: str | None, fixed_length: bool, out: Path,
                      batch_size: int = 64) -> None:
    """The reference backend's evaluation on DeepSpeed-Chat's policy, which has no greedy accuracy of its own: greedy
    responses (max_answer_seq_len tokens at most) to the shared dataset's eval prompts from the initial actor and from
    the one main.py saved (output_dir/actor), scored by the task's exact match and by the shared reward. Outside
    every timed step: main.py has returned."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    def flag(name: str) -> str:
        return main_args[main_args.index(name) + 1]

    with open(dataset) as f:
        rows = [r for r in map(json.loads, f) if r["split"] == "eval"]
    max_new = int(flag("--max_answer_seq_len"))
    tokenizer = AutoTokenizer.from_pretrained(flag("--actor_model_name_or_path"))
    tokenizer.padding_side = "left"

    def point(path: str) -> dict:
        model = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32).eval()
        hits, total, kept = 0, 0.0, []
        stops = {tokenizer.pad_token_id, tokenizer.eos_token_id} - {None}
        for i in range(0, len(rows), batch_size):
            batch = rows[i:i + batch_size]
            enc = tokenizer([r["prompt"] for r in batch], return_tensors="pt", padding=True)
            with torch.no_grad():
                out_ids = model.generate(**enc, do_sample=False, max_new_tokens=max_new,
                                         min_new_tokens=max_new if fixed_length else None,
                                         pad_token_id=tokenizer.pad_token_id)
            responses = out_ids[:, enc["input_ids"].shape[1]:]
            texts: list[str] = [tokenizer.decode(r[:n], skip_special_tokens=True)
                                for r, n in zip(responses.tolist(), response_lengths(responses, stops))]
            hits += sum(shared_reward.correct(t, r["answer"]) for t, r in zip(texts, batch))
            total += sum(shared_reward.score_batch([r["prompt"] for r in batch], texts, [r["answer"] for r in batch],
                                                   reward_url))
            kept += [{"prompt": r["prompt"], "response": t} for r, t in zip(batch, texts)]
        return {"greedy_accuracy": hits / len(rows), "reward_mean": total / len(rows), "n": len(rows),
                "responses": kept}

    record = {"before": point(flag("--actor_model_name_or_path")),
              "after": point(os.path.join(flag("--output_dir"), "actor"))}
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(record))
    tmp.rename(out)

