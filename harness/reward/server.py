"""The one shared reward, served over HTTP with OpenRLHF's remote reward protocol, so every framework that takes a
reward over HTTP is scored by the same code (`harness.reward.shared.SharedReward`: the rule or a reward model).

POST (any of REWARD_PATHS) `{"query": [prompt + response, ...], "prompts": [prompt, ...], "labels": [answer, ...]}`
-> `{"rewards": [...], "scores": [...], "extra_logs": {"exact_match": [...]}}` (one entry per query; OpenRLHF's
own `serve_rm` also answers per-query lists in extra_logs). The response is the query with its prompt removed, so a
query that does not begin with its prompt is refused rather than scored wrongly. `exact_match` is the task's truth
(harness.reward.correct) whatever the reward's kind, so a reward model's score can be read against true accuracy.
GET /health answers which reward is served (kind, what, sha256) and what was served so far (requests, texts,
score calls, failed calls, requests refused as overloaded, over the body budget, connections refused; requests
waiting, connections open and body bytes held now). Bad requests get a 4xx with a JSON
`{"error": ...}` naming what is wrong, and the server keeps serving: a request line or header the HTTP parser refuses
(400, 414, 431, 501 or 505), a body that is not JSON, nested past the parser's limit, or holding a number Python
cannot convert (an integer of more than 4300 digits; 400), and a text holding a lone surrogate (400: no tokenizer
encodes it, and scored it would fail its whole batch). It listens on loopback unless told otherwise: it has no
authentication.

Slow clients: a request's line, headers and body must all arrive within `request_timeout_s` (REQUEST_TIMEOUT_S, 60 s)
of its first byte, however the client spaces its bytes; otherwise it is answered 408 `{"error": ...}` and its
connection closed. A keep-alive connection idle between requests is closed unanswered after IDLE_TIMEOUT_S: no request
is pending there, and an unsolicited 408 would be read as the answer to the client's next request. Writing an answer
may block at most IDLE_TIMEOUT_S (a client that does not read it is dropped).

Batching: OpenRLHF sends one request per sample, all of a rollout at once, so requests arrive together. One
scoring thread takes everything queued when it becomes free (whole requests, up to `max_batch` texts; a larger
request alone), scores it with ONE `shared_reward.score` call (one forward pass for a reward model of that batch
size) and hands each request its slice. There is no wait window: a lone request is scored at once, and requests
that arrive while a batch is scored form the next batch. The model is only ever used from that one thread.
An exception while scoring answers 500 `{"error": ...}` to every request of that batch; the next batch is scored.

Overload: at most `max_pending` requests wait for the scorer; one more is answered at once with 503
`{"error": "overloaded: ..."}` and `Retry-After: 1`, so memory stays bounded. What the clients do with it:
OpenRLHF 0.11.2's own client (openrlhf/utils/agent.py, SingleTurnAgentExecutor._fetch_rewards_via_http) calls
`raise_for_status()` on any non-2xx answer and tries 5 times in all, sleeping 1 s between tries (it ignores
Retry-After); after the 5th failure its caller logs "Failed to fetch reward from remote RM" and the sample is left
without a reward. This project's ReMax agent (harness/frameworks/openrlhf/inside/remax/remax_agent.py) also tries 5
times 1 s apart on a 5xx, fails at once on a 4xx, and fails the rollout after the 5th try. So a 503 costs a client
about a second, and `max_pending` must exceed the requests one rollout step sends at once (the default does).

Memory: two caps bound it in total, whatever the clients do. Request bodies held at once, across all connections,
are at most `max_buffered_bytes` (DEFAULT_MAX_BUFFERED, 256 MiB): a request reserves its Content-Length before its
body is read and releases it once answered (or dropped); one that would pass the cap is answered at once with 503
`{"error": "overloaded: ..."}` and `Retry-After: 1`, its body unread and its connection closed. A body's decoded
text is held beside it while it is scored, so the bodies take a small multiple of the cap at most. Open connections
are at most `max_connections` (DEFAULT_MAX_CONNECTIONS, 8,192), each a thread; one more is answered the same 503 by
the accepting thread itself (no thread started, nothing waited for) and closed. `max_body` (8 MiB) still caps one
request (413) and must fit the budget. Real use sits far inside both: a 1,024-prompt rollout step sends ~2,000
one-sample requests of a few to ~20 KB each, ~2,000 connections and ~40 MB at once; a queue full at the default
`max_pending` (4,096) of 64 KB requests still fits the budget. docs/frameworks.md has the measured figures.

Disconnects: a client that goes away (a reset or a close during its request, while its answer is written, or a reset
while idle) is one line in the log, naming it and when; a close between requests is how a keep-alive connection
ends, and no line.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import socket
import sys
import threading
import time
import urllib.error
import urllib.request
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

from harness import HarnessError, reward
from harness.reward.batching import RETRY_AFTER_S, Batcher, RequestError
from harness.reward.limits import ByteBudget, check_limits
from harness.reward.shared import SharedReward

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

REWARD_PATHS = ("/", "/get_reward")
HEALTH_PATH = "/health"
CONTENT_LENGTH = re.compile(r"[0-9]{1,18}")
FIELDS = ("query", "prompts", "labels")
DEFAULT_MAX_BODY = 8 << 20  # a 1024-prompt batch of 2k-token texts is ~10 MB at most; larger is a client bug
# One request per sample: a 1024-prompt rollout step of a sample and a greedy baseline each is ~2,000 at once.
DEFAULT_MAX_PENDING = 4096
DEFAULT_MAX_BATCH = 64  # texts per score call; the config's reward.batch_size default
# Bodies held at once: a rollout step's ~2,000 one-sample requests take ~40 MB; a full queue of 64 KB requests fits.
DEFAULT_MAX_BUFFERED = 256 << 20
# A thread each: twice DEFAULT_MAX_PENDING, as every waiting request holds a connection while others are read;
# ~27 KiB each measured, ~220 MiB at the cap.
DEFAULT_MAX_CONNECTIONS = 8192
# A whole request, from its first byte: a client sends even a 10 MB body within a second or two, so a request still
# arriving after a minute comes from a stalled or hostile client, which holds a thread meanwhile.
REQUEST_TIMEOUT_S = 60.0
IDLE_TIMEOUT_S = 60  # a keep-alive connection between requests, and one write of an answer
LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def parse_request(payload: object) -> tuple[list[str], list[str], list[str]]:
    """(prompts, responses, labels) of one decoded request body; RequestError (4xx) names what is wrong."""
    if not isinstance(payload, dict):
        raise RequestError(HTTPStatus.BAD_REQUEST, f"expected a JSON object with {', '.join(FIELDS)}, "
                                                   f"got {type(payload).__name__}")
    missing = [f for f in FIELDS if f not in payload]
    if missing:
        raise RequestError(HTTPStatus.BAD_REQUEST, f"missing field(s): {', '.join(missing)}")
    for f in FIELDS:
        value = payload[f]
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise RequestError(HTTPStatus.BAD_REQUEST, f"field {f!r} must be a list of strings")
        for i, text in enumerate(value):
            if surrogate := LONE_SURROGATE.search(text):
                raise RequestError(HTTPStatus.BAD_REQUEST,
                                   f"{f}[{i}] is not Unicode text: a lone surrogate {surrogate.group()!r} at index "
                                   f"{surrogate.start()}")
    lengths = {f: len(payload[f]) for f in FIELDS}
    if len(set(lengths.values())) != 1:
        raise RequestError(HTTPStatus.BAD_REQUEST, "query, prompts and labels must have the same length, got "
                                                   + ", ".join(f"{f}={n}" for f, n in lengths.items()))
    responses = []
    for i, (query, prompt) in enumerate(zip(payload["query"], payload["prompts"])):
        if not query.startswith(prompt):
            raise RequestError(HTTPStatus.UNPROCESSABLE_ENTITY,
                               f"query[{i}] does not begin with prompts[{i}]; "
                               "the response is the query after its prompt")
        responses.append(query[len(prompt):])
    return payload["prompts"], responses, payload["labels"]


class _DeadlineReader(io.RawIOBase):
    """A connection's incoming bytes. Without a `deadline` a read waits IDLE_TIMEOUT_S; with one, no read ends after
    it, so the deadline bounds a request as a whole (a socket timeout bounds each read, not their sum). `expired`
    tells that a read failed because the deadline passed."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self.deadline: float | None = None
        self.expired = False

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: WriteableBuffer) -> int:
        if self.deadline is None:
            self._sock.settimeout(IDLE_TIMEOUT_S)
            return self._sock.recv_into(buffer)
        try:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("the request's deadline has passed")
            self._sock.settimeout(left)
            return self._sock.recv_into(buffer)
        except TimeoutError:
            self.expired = True
            raise


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: a client reuses its connection across requests
    server_version = "remax-bench-reward"
    # Headers and body go out in two writes: with Nagle's algorithm on, the second waits ~40 ms for the
    # client's delayed ACK on every request.
    disable_nagle_algorithm = True
    server: RewardServer
    timeout = IDLE_TIMEOUT_S

    def setup(self) -> None:
        super().setup()
        self.rfile.close()  # the stdlib's reader, replaced by one that bounds each request as a whole
        self._reader = _DeadlineReader(self.connection)
        self._incoming = self.rfile = io.BufferedReader(self._reader)
        self._phase = "while idle"  # where a disconnect finds the connection, for its log line

    def handle(self) -> None:
        try:
            super().handle()
        except ConnectionError as e:  # the client's doing, not a fault here: one line, not socketserver's traceback
            self.close_connection = True
            host, port = self.client_address[:2]
            self.log_error("the client at %s:%s disconnected %s (%s: %s)", host, port, self._phase,
                           type(e).__name__, e)

    def handle_one_request(self) -> None:
        self._reader.deadline, self._reader.expired = None, False
        self._phase = "while idle"
        try:
            waiting = self._incoming.peek(1)
        except TimeoutError:  # idle: no request is pending (see the module docstring)
            waiting = b""
        if not waiting:
            self.close_connection = True
            return
        self._reader.deadline = time.monotonic() + self.server.request_timeout_s
        self._phase = "during its request"
        # The stdlib reads the line before it sets these; a request that times out in its line is still answered.
        self.requestline, self.request_version, self.command = "", self.protocol_version, ""
        # The stdlib drops a connection whose read times out, unanswered.
        super().handle_one_request()
        if self._reader.expired:
            with contextlib.suppress(OSError):  # the stalled client may be gone
                self._refuse(HTTPStatus.REQUEST_TIMEOUT,
                             f"the request did not arrive within {self.server.request_timeout_s:g} s of its first byte")

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """The stdlib's answer to a request line or header it refuses (or an unknown method): JSON, as every answer
        here, where the stdlib writes HTML."""
        text = message or HTTPStatus(code).phrase
        self._refuse(HTTPStatus(code), f"{text}: {explain}" if explain else text)

    def _refuse(self, status: HTTPStatus, message: str) -> None:
        """Answer a request that could not be read whole, and close its connection: what is left of it is unknown."""
        self.close_connection = True
        # A line without an HTTP version leaves the stdlib's HTTP/0.9, whose answers have no status line.
        self.request_version = self.protocol_version
        self._error(status, message)

    def _send(self, status: HTTPStatus, obj: dict) -> None:
        body = json.dumps(obj).encode()
        self.connection.settimeout(self.timeout)  # reads leave it at what was left of the request's deadline
        self._phase = "while its answer was written"
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        if status == HTTPStatus.SERVICE_UNAVAILABLE:
            self.send_header("Retry-After", str(RETRY_AFTER_S))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)

    def _error(self, status: HTTPStatus, message: str) -> None:
        self._send(status, {"error": message})

    def do_GET(self) -> None:
        if self.path != HEALTH_PATH:
            return self._error(HTTPStatus.NOT_FOUND, f"no such path {self.path!r} (GET {HEALTH_PATH})")
        self._send(HTTPStatus.OK, {"status": "ok", **self.server.identity, "served": self.server.stats()})

    def do_POST(self) -> None:
        try:
            self._post()
        except (TimeoutError, ConnectionError):
            # The body came too slowly (answered 408 by handle_one_request), the client does not read, or it is gone
            # (logged by handle): an answer here would fail again.
            raise
        except Exception as e:  # never drop a connection without an answer; the batch's own errors are answered 500
            self.close_connection = True
            self.log_error("%s %s: %s: %s", self.command, self.path, type(e).__name__, e)
            self._error(HTTPStatus.INTERNAL_SERVER_ERROR, f"the server failed on this request ({type(e).__name__})")

    def _post(self) -> None:
        if self.path not in REWARD_PATHS:
            self.close_connection = True  # the body is left unread
            return self._error(HTTPStatus.NOT_FOUND, f"no such path {self.path!r} (POST {' or '.join(REWARD_PATHS)})")
        header = self.headers.get("Content-Length")
        if header is None:
            self.close_connection = True
            return self._error(HTTPStatus.LENGTH_REQUIRED, "a Content-Length header is required")
        # ASCII digits only: str.isdigit() also takes '²' and other digits int() refuses or reads otherwise.
        if not CONTENT_LENGTH.fullmatch(header.strip()):
            self.close_connection = True  # the body's extent is unknown: the connection cannot be reused
            return self._error(HTTPStatus.BAD_REQUEST, f"Content-Length {header[:40]!r} is not a byte count")
        length = int(header)
        if length > self.server.max_body:
            # Answer without reading the body, then drop the connection: the unread bytes cannot be reused.
            self.close_connection = True
            return self._error(HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                               f"body of {length} bytes exceeds the limit of {self.server.max_body} bytes")
        try:
            self.server.budget.reserve(length)  # before a byte of the body is read: the read allocates it whole
        except RequestError as e:
            self.close_connection = True  # the body is left unread
            return self._error(e.status, str(e))
        try:
            self._score(length)
        finally:
            self.server.budget.release(length)

    def _score(self, length: int) -> None:
        raw = self.rfile.read(length)
        if len(raw) < length:  # the client closed its side mid-body: there is no one to answer
            raise ConnectionError(f"it closed after {len(raw)} of {length} body bytes")
        try:
            payload = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            return self._error(HTTPStatus.BAD_REQUEST, f"body is not valid JSON: {e}")
        except ValueError as e:  # an integer of more digits than int() converts (sys.get_int_max_str_digits)
            return self._error(HTTPStatus.BAD_REQUEST, f"a number in the body cannot be parsed: {e}")
        except RecursionError:  # a request is two levels deep; Python's parser stops near a thousand
            return self._error(HTTPStatus.BAD_REQUEST, "body is JSON nested too deep to parse")
        try:
            prompts, responses, labels = parse_request(payload)
            rewards = self.server.batcher.score(prompts, responses, labels)
        except RequestError as e:
            return self._error(e.status, str(e))
        exact = [float(reward.correct(r, a)) for r, a in zip(responses, labels)]
        self._send(HTTPStatus.OK, {"rewards": rewards, "scores": rewards, "extra_logs": {"exact_match": exact}})

    def log_message(self, format: str, *args: Any) -> None:  # one line per request would cost more than scoring it
        pass

    def log_error(self, format: str, *args: Any) -> None:
        sys.stderr.write("reward server: " + (format % args) + "\n")


class RewardServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024  # every rollout request opens its own connection (OpenRLHF's client does)

    def __init__(self, host: str, port: int, shared_reward: SharedReward, *, max_body: int = DEFAULT_MAX_BODY,
                 max_pending: int = DEFAULT_MAX_PENDING, max_batch: int = DEFAULT_MAX_BATCH,
                 request_timeout_s: float = REQUEST_TIMEOUT_S, max_buffered_bytes: int = DEFAULT_MAX_BUFFERED,
                 max_connections: int = DEFAULT_MAX_CONNECTIONS) -> None:
        check_limits(max_body, max_buffered_bytes, max_connections)
        self.batcher = Batcher(shared_reward, max_pending, max_batch)
        try:
            super().__init__((host, port), _Handler)
        except BaseException:
            self.batcher.close()
            raise
        self.max_body, self.request_timeout_s = max_body, request_timeout_s
        self.budget, self.max_connections = ByteBudget(max_buffered_bytes), max_connections
        self._connections, self._connections_refused = 0, 0
        self._lock = threading.Lock()
        self.identity = shared_reward.identity

    def stats(self) -> dict:
        with self._lock:
            connections, refused = self._connections, self._connections_refused
        return {**self.batcher.stats(), "over_budget": self.budget.refused, "connections_refused": refused,
                "connections": connections, "buffered_bytes": self.budget.held}

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._lock:
            full = self._connections >= self.max_connections
            self._connections += not full
        if full:
            return self._refuse_connection(request, f"{self.max_connections} connections are open "
                                                    f"(--max-connections {self.max_connections})")
        try:
            super().process_request(request, client_address)
        except RuntimeError as e:  # no thread to be had (a limit of the process or the user's): the cap, met early
            self._closed_one()
            self._refuse_connection(request, f"no thread for one more connection ({e})")

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._closed_one()

    def _closed_one(self) -> None:
        with self._lock:
            self._connections -= 1

    def _refuse_connection(self, sock: socket.socket, why: str) -> None:
        """503 and close, from the accepting thread without waiting: a client that reads or sends nothing holds
        nothing here, and no thread is started for it."""
        with self._lock:
            self._connections_refused += 1
        body = json.dumps({"error": f"overloaded: {why}; retry in {RETRY_AFTER_S} s"}).encode()
        head = (f"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: {len(body)}"
                f"\r\nRetry-After: {RETRY_AFTER_S}\r\nConnection: close\r\n\r\n").encode()
        with contextlib.suppress(OSError):
            sock.setblocking(False)
            sock.send(head + body)  # a new connection's empty send buffer takes it whole
            # Read what the client sent already, so that the close is a FIN: an RST can discard the answer unread.
            for _ in range(16):
                if not sock.recv(1 << 16):
                    break
        self.shutdown_request(sock)

    def server_close(self) -> None:
        super().server_close()
        self.batcher.close()

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host if isinstance(host, str) else host.decode()}:{port}"


def serve(host: str, port: int, shared_reward: SharedReward, *, max_body: int = DEFAULT_MAX_BODY,
          max_pending: int = DEFAULT_MAX_PENDING, max_batch: int = DEFAULT_MAX_BATCH,
          max_buffered_bytes: int = DEFAULT_MAX_BUFFERED, max_connections: int = DEFAULT_MAX_CONNECTIONS) -> None:
    try:
        server = RewardServer(host, port, shared_reward, max_body=max_body, max_pending=max_pending,
                              max_batch=max_batch, max_buffered_bytes=max_buffered_bytes,
                              max_connections=max_connections)
    except OSError as e:
        raise HarnessError(f"reward server: cannot listen on {host}:{port} ({e.strerror or e})") from None
    identity = server.identity
    print(f"reward server: serving {identity['reward']} at {server.url} "
          f"(POST {' or '.join(REWARD_PATHS)}, GET {HEALTH_PATH}; {identity['kind']} reward, sha256 "
          f"{identity['sha256']}; up to {max_batch} texts per score call, {max_pending} requests waiting, "
          f"{max_connections} connections, {max_buffered_bytes} body bytes held)", flush=True)
    with server, contextlib.suppress(KeyboardInterrupt):
        server.serve_forever()


def wait_healthy(url: str, timeout_s: float) -> dict:
    """Poll `url`/health until it answers ok; HarnessError after `timeout_s` seconds."""
    deadline = time.monotonic() + timeout_s
    health = url.rstrip("/") + HEALTH_PATH
    last = "no answer"
    while True:
        try:
            with urllib.request.urlopen(health, timeout=5) as resp:
                answer = json.loads(resp.read())
            if answer.get("status") == "ok":
                return answer
            last = f"answered {answer}"
        except (urllib.error.URLError, OSError, ValueError) as e:
            last = str(getattr(e, "reason", e))
        if time.monotonic() >= deadline:
            raise HarnessError(f"reward server at {url}: not healthy after {timeout_s:g} s ({last})")
        time.sleep(0.2)
