"""What bounds the reward server's memory besides its queue (harness.reward.server's docstring, "Memory"): the budget of
request-body bytes held across all connections, and the check of the limits it is given."""

from __future__ import annotations

import threading
from http import HTTPStatus

from harness import HarnessError
from harness.reward.batching import RETRY_AFTER_S, RequestError


def check_limits(max_body: int, max_buffered_bytes: int, max_connections: int) -> None:
    """HarnessError, naming the options, for limits under which requests could never be served."""
    for name, value in (("--max-body-bytes", max_body), ("--max-buffered-bytes", max_buffered_bytes),
                        ("--max-connections", max_connections)):
        if value < 1:
            raise HarnessError(f"reward server: {name} must be at least 1, got {value}")
    if max_buffered_bytes < max_body:
        raise HarnessError(f"reward server: --max-buffered-bytes {max_buffered_bytes} is less than --max-body-bytes "
                           f"{max_body}: no body that large could ever be read")


class ByteBudget:
    """The request-body bytes held at once across all connections (the module docstring's "Memory")."""

    def __init__(self, limit: int) -> None:
        self.limit, self.held, self.refused = limit, 0, 0
        self._lock = threading.Lock()

    def reserve(self, n: int) -> None:
        """Hold `n` more bytes; RequestError 503 at once where that would pass the limit."""
        with self._lock:
            if self.held + n > self.limit:
                self.refused += 1
                raise RequestError(HTTPStatus.SERVICE_UNAVAILABLE,
                                   f"overloaded: {self.held} bytes of request bodies are held (--max-buffered-bytes "
                                   f"{self.limit} in all); this one's {n} would pass it; retry in {RETRY_AFTER_S} s")
            self.held += n

    def release(self, n: int) -> None:
        with self._lock:
            self.held -= n
