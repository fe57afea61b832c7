"""Continuous batching in front of one `SharedReward` (harness.reward.server's docstring, "Batching" and "Overload"):
a bounded queue of requests and one scoring thread, which alone uses the model."""

from __future__ import annotations

import collections
import sys
import threading
import traceback
from http import HTTPStatus

from harness import HarnessError
from harness.reward.shared import SharedReward

RETRY_AFTER_S = 1  # OpenRLHF's clients wait 1 s between tries whatever it says


class RequestError(Exception):
    """A request answered with `status` and `{"error": message}` (4xx: the request; 5xx: the server)."""

    def __init__(self, status: HTTPStatus, message: str) -> None:
        super().__init__(message)
        self.status = status


class _Job:
    __slots__ = ("done", "error", "labels", "prompts", "responses", "rewards")

    def __init__(self, prompts: list[str], responses: list[str], labels: list[str]) -> None:
        self.prompts, self.responses, self.labels = prompts, responses, labels
        self.done = threading.Event()
        self.rewards: list[float] | None = None
        self.error: RequestError | None = None

    def finish(self, rewards: list[float] | None = None, error: RequestError | None = None) -> None:
        self.rewards, self.error = rewards, error
        self.done.set()


class Batcher:
    """Continuous batching in front of one `SharedReward`: a bounded queue of requests and one scoring thread."""

    def __init__(self, shared_reward: SharedReward, max_pending: int, max_batch: int) -> None:
        for name, value in (("max_pending (--max-pending)", max_pending), ("max_batch (--batch-size)", max_batch)):
            if value < 1:
                raise HarnessError(f"reward server: {name} must be at least 1, got {value}")
        self.shared_reward, self.max_pending, self.max_batch = shared_reward, max_pending, max_batch
        self._queue: collections.deque[_Job] = collections.deque()
        self._cond = threading.Condition()
        self._closed = False
        # What was served, for /health: shows how many requests each score call took on average.
        self._served = {"requests": 0, "texts": 0, "score_calls": 0, "failed_calls": 0, "overloaded": 0}
        self._thread = threading.Thread(target=self._run, name="reward-scorer", daemon=True)
        self._thread.start()

    def score(self, prompts: list[str], responses: list[str], labels: list[str]) -> list[float]:
        """The rewards of one request, scored in whatever batch it joins; RequestError 503 when the queue is full
        (at once, without waiting), 500 when scoring its batch failed."""
        job = _Job(prompts, responses, labels)
        with self._cond:
            if self._closed:
                raise RequestError(HTTPStatus.SERVICE_UNAVAILABLE, "the reward server is shutting down")
            if len(self._queue) >= self.max_pending:
                self._served["overloaded"] += 1
                raise RequestError(HTTPStatus.SERVICE_UNAVAILABLE,
                                   f"overloaded: {len(self._queue)} requests already wait to be scored (the limit, "
                                   f"--max-pending {self.max_pending}); retry in {RETRY_AFTER_S} s")
            self._queue.append(job)
            self._cond.notify()
        job.done.wait()
        if job.error is not None:
            raise job.error
        assert job.rewards is not None  # finish() sets one of the two
        return job.rewards

    def stats(self) -> dict:
        with self._cond:
            return {**self._served, "waiting": len(self._queue)}

    def close(self) -> None:
        """Stop after the batch being scored; requests still queued are answered 503."""
        with self._cond:
            self._closed = True
            left = list(self._queue)
            self._queue.clear()
            self._cond.notify()
        for job in left:
            job.finish(error=RequestError(HTTPStatus.SERVICE_UNAVAILABLE, "the reward server is shutting down"))
        self._thread.join(timeout=60)

    def _take(self) -> list[_Job] | None:
        with self._cond:
            while not self._queue and not self._closed:
                self._cond.wait()
            if self._closed:
                return None
            batch = [self._queue.popleft()]
            n = len(batch[0].prompts)
            while self._queue and n + len(self._queue[0].prompts) <= self.max_batch:
                job = self._queue.popleft()
                batch.append(job)
                n += len(job.prompts)
            self._served["requests"] += len(batch)
            self._served["texts"] += n
            self._served["score_calls"] += n > 0
            return batch

    def _run(self) -> None:
        while (batch := self._take()) is not None:
            prompts = [p for job in batch for p in job.prompts]
            responses = [r for job in batch for r in job.responses]
            labels = [a for job in batch for a in job.labels]
            try:
                rewards = [float(x) for x in self.shared_reward.score(prompts, responses, labels)] if prompts else []
                if len(rewards) != len(prompts):
                    raise ValueError(f"the shared reward returned {len(rewards)} scores for {len(prompts)} texts")
            except Exception as e:
                sys.stderr.write(f"reward server: scoring a batch of {len(prompts)} texts failed:\n"
                                 + traceback.format_exc())
                with self._cond:
                    self._served["failed_calls"] += 1
                error = RequestError(HTTPStatus.INTERNAL_SERVER_ERROR,
                                     f"scoring failed ({self.shared_reward.identity['reward']}): "
                                     f"{type(e).__name__}: {e}")
                for job in batch:
                    job.finish(error=error)
                continue
            start = 0
            for job in batch:
                job.finish(rewards[start:start + len(job.prompts)])
                start += len(job.prompts)
