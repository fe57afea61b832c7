"""ReMax rollouts for OpenRLHF 0.11.2: the agent executor loaded by `--train.agent_func_path` in each vLLM rollout
actor.

Per sample OpenRLHF calls `AgentExecutor.execute` (n times per prompt, concurrently, from
`RolloutRayActor.generate_responses`). Each call generates the sample with the given sampling parameters and, once
per prompt, a greedy response (temperature 0) with the same length budget; both are scored by the shared reward
server (OpenRLHF's remote reward protocol, the URL in remax_agent.json beside this file). The sample's reward is
returned as its reward, the greedy reward as extra_logs["remax_baseline"], which OpenRLHF carries into
Experience.info, where the patched "remax" estimator (remax_patch.py) subtracts it.

With min_tokens_is_max_tokens (remax.generation_length fixed) every request, sample and greedy, gets vLLM's
min_tokens = max_tokens: EOS is masked until the length budget, as OpenRLHF's own SamplingParams(min_tokens=...)
would do if train_ppo_ray passed a min_new_tokens. Otherwise min_tokens is 0, as in the shared spec and the other
frameworks: OpenRLHF's default of 1 (samples_generator.py: min_new_tokens, which train_ppo_ray never sets) would
forbid the empty response the policy may give.

The prompt starts with the tokenizer's BOS where the tokenizer's own post-processor adds one (the shared policy's
does, and was trained so): OpenRLHF tokenizes prompts with add_special_tokens=False, which would drop it.

Generation goes through OpenRLHF's own SingleTurnAgentExecutor (tokenisation, prompt truncation, the engine call),
without its reward request: that one sends the decoded prompt+response with special tokens (EOS) and swallows
errors. Here the response is decoded without special tokens, and a failed reward request fails the rollout instead
of leaving a sample without reward or baseline.

Each sampled request asks vLLM for the log-prob of the token it sampled (SamplingParams.logprobs = 1), which
OpenRLHF's SingleTurnAgentExecutor.execute collects into the sample's rollout_log_probs (utils/agent.py) and the
patch (remax_patch.py) sets against the actor's: the rollout/trainer mismatch of every run (issue #51). Stock
OpenRLHF asks for it only with its IS correction on (samples_generator.py), which also reweights the loss; here
nothing reads it but the patch's sums. The greedy request asks for none.

The n calls for one prompt share one greedy request: the first call starts it, later calls for the same prompt
and label join it while it runs. All n calls start before any generation finishes, and a finished request is
dropped, so the next step (new weights) asks again.

Under reproducibility.determinism strict (remax_agent.json sampling_seed: the run's seed) each sampled request gets
its own vLLM seed, which OpenRLHF never sets (samples_generator.py builds SamplingParams without one, so a sample
depends on the engine's one generator and on what else shares its batch). The seed is drawn from the run's seed, the
prompt, its label and how many times this executor has seen them before, counted when a call starts: the calls for
a prompt start in OpenRLHF's order (generate_responses gathers them in order; a step's prompts go to the engines
by a load heap that is the same for every step, as all engines are idle when a step dispatches), so a rerun asks for
the same samples whatever order they finish in. The greedy request needs no seed.
"""

import asyncio
import hashlib
import json
from collections import Counter
from copy import deepcopy
from pathlib import Path

import aiohttp
from openrlhf.utils.agent import SingleTurnAgentExecutor

CONFIG = Path(__file__).with_name("remax_agent.json")
REQUEST_TIMEOUT_S = 180  # as OpenRLHF's own remote-reward client
TRIES = 5


class RewardRequestError(RuntimeError):
    pass


class AgentExecutor(SingleTurnAgentExecutor):
    def __init__(self):
        super().__init__(remote_rm_url=None)  # generation only: rewards come from score() below
        config = json.loads(CONFIG.read_text())
        self.reward_url = config["reward_url"]
        self.fixed_length = config["min_tokens_is_max_tokens"]
        self.sampling_seed = config.get("sampling_seed")
        self._greedy_in_flight = {}
        self._seen = Counter()

    async def execute(self, prompt, label, sampling_params, max_length, hf_tokenizer, llm_engine, images=None):
        sampling_params = deepcopy(sampling_params)
        sampling_params.min_tokens = sampling_params.max_tokens if self.fixed_length else 0
        sampling_params.logprobs = 1  # the sampled token's log-prob (module docstring: the rollout mismatch)
        key = (prompt, label)
        if self.sampling_seed is not None:
            sampling_params.seed = request_seed(self.sampling_seed, prompt, label, self._seen[key])
            self._seen[key] += 1
        greedy = self._greedy_in_flight.get(key)
        if greedy is None:
            greedy = asyncio.ensure_future(
                self._greedy(prompt, label, sampling_params, max_length, hf_tokenizer, llm_engine, images))
            self._greedy_in_flight[key] = greedy
            greedy.add_done_callback(lambda done: self._forget(key, done))
        sample = await super().execute(with_bos(prompt, hf_tokenizer), label, sampling_params, max_length,
                                       hf_tokenizer, llm_engine, images)
        sample_reward = await self.score(prompt, response_text(sample, hf_tokenizer), label)
        baseline, baseline_tokens = await greedy
        sample.update(reward=sample_reward, scores=sample_reward,
                      extra_logs={"remax_baseline": baseline, "remax_baseline_tokens": float(baseline_tokens)})
        return sample

    def _forget(self, key, done):
        if self._greedy_in_flight.get(key) is done:
            del self._greedy_in_flight[key]

    async def _greedy(self, prompt, label, sampling_params, max_length, hf_tokenizer, llm_engine, images):
        params = deepcopy(sampling_params)
        # Greedy decoding as vLLM normalises it for temperature 0 (and as verl's ReMax asks for it).
        params.temperature, params.top_p, params.top_k = 0.0, 1.0, -1
        params.logprobs = params.seed = None
        out = await super().execute(with_bos(prompt, hf_tokenizer), label, params, max_length, hf_tokenizer,
                                    llm_engine, images)
        start, end = out["action_ranges"][0]
        return await self.score(prompt, response_text(out, hf_tokenizer), label), end - start

    async def score(self, prompt, response, label):
        """The shared reward of one response, from the reward server."""
        payload = {"query": [prompt + response], "prompts": [prompt], "labels": [label]}
        timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
        last = None
        for _ in range(TRIES):
            try:
                async with aiohttp.ClientSession(timeout=timeout) as session, \
                        session.post(self.reward_url, json=payload) as resp:
                    body = await resp.json(content_type=None)
                    if 400 <= resp.status < 500:  # the request itself is wrong: asking again cannot help
                        raise RewardRequestError(f"reward server {self.reward_url} refused the request "
                                                 f"(HTTP {resp.status}): {body.get('error', body)}")
                    resp.raise_for_status()
                    return float(body["rewards"][0])
            except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, KeyError) as e:
                last = e
                await asyncio.sleep(1)
        raise RewardRequestError(f"reward server {self.reward_url}: no answer after {TRIES} tries ({last!r})")


def request_seed(run_seed, prompt, label, occurrence):
    """A sampled request's vLLM seed (63 bits, as torch.Generator.manual_seed takes it)."""
    digest = hashlib.sha256(json.dumps([run_seed, prompt, label, occurrence]).encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def with_bos(prompt, hf_tokenizer):
    """The prompt as the tokenizer encodes it with its special tokens, for OpenRLHF's add_special_tokens=False."""
    bos = hf_tokenizer.bos_token_id
    if bos is None or hf_tokenizer(prompt)["input_ids"][:1] != [bos] or prompt.startswith(hf_tokenizer.bos_token):
        return prompt
    return hf_tokenizer.bos_token + prompt


def response_text(output, hf_tokenizer):
    start, end = output["action_ranges"][0]
    return hf_tokenizer.decode(output["observation_tokens"][start:end], skip_special_tokens=True)
