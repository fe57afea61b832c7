"""The one shared reward, served over HTTP with OpenRLHF's remote reward protocol, so every framework that takes a
reward over HTTP is scored by the same code (harness.reward.score).

POST (any of REWARD_PATHS) `{"query": [prompt + response, ...], "prompts": [prompt, ...], "labels": [answer, ...]}`
-> `{"rewards": [...], "scores": [...], "extra_logs": {"exact_match": [...]}}` (one entry per query; OpenRLHF's
own `serve_rm` also answers per-query lists in extra_logs). The response is the query with its prompt removed, so a
query that does not begin with its prompt is refused rather than scored wrongly. GET /health answers which reward
is served (with the sha256 of its source). Bad requests get a 4xx with a JSON `{"error": ...}` naming what is wrong,
and the server keeps serving. It listens on loopback unless told otherwise: it has no authentication.
"""

from __future__ import annotations

import inspect
import json
import sys
import time
import urllib.error
import urllib.request
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from harness import HarnessError, reward
from harness.io import sha256_file

REWARD_PATHS = ("/", "/get_reward")
HEALTH_PATH = "/health"
FIELDS = ("query", "prompts", "labels")
DEFAULT_MAX_BODY = 8 << 20  # a 1024-prompt batch of 2k-token texts is ~10 MB at most; larger is a client bug


class RequestError(Exception):
    def __init__(self, status: HTTPStatus, message: str):
        super().__init__(message)
        self.status = status


def score_request(payload) -> dict:
    """Validate one decoded request body and score it; RequestError (4xx) names what is wrong."""
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
    lengths = {f: len(payload[f]) for f in FIELDS}
    if len(set(lengths.values())) != 1:
        raise RequestError(HTTPStatus.BAD_REQUEST, "query, prompts and labels must have the same length, got "
                                                   + ", ".join(f"{f}={n}" for f, n in lengths.items()))
    rewards, exact = [], []
    for i, (query, prompt, label) in enumerate(zip(payload["query"], payload["prompts"], payload["labels"])):
        if not query.startswith(prompt):
            raise RequestError(HTTPStatus.UNPROCESSABLE_ENTITY,
                               f"query[{i}] does not begin with prompts[{i}]; the response is the query after its prompt")
        response = query[len(prompt):]
        rewards.append(reward.score(prompt, response, label))
        exact.append(float(reward.correct(response, label)))
    return {"rewards": rewards, "scores": rewards, "extra_logs": {"exact_match": exact}}


def reward_identity() -> dict:
    return {"reward": f"{reward.__name__}.score", "sha256": sha256_file(inspect.getsourcefile(reward))}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: a client reuses its connection across requests
    server_version = "remax-bench-reward"
    # Headers and body go out in two writes: with Nagle's algorithm on, the second waits ~40 ms for the
    # client's delayed ACK on every request.
    disable_nagle_algorithm = True
    timeout = 60  # seconds a connection may sit idle or send a short body before it is dropped

    def _send(self, status: HTTPStatus, obj: dict) -> None:
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)

    def _error(self, status: HTTPStatus, message: str) -> None:
        self._send(status, {"error": message})

    def do_GET(self):
        if self.path != HEALTH_PATH:
            return self._error(HTTPStatus.NOT_FOUND, f"no such path {self.path!r} (GET {HEALTH_PATH})")
        self._send(HTTPStatus.OK, {"status": "ok", **self.server.identity})

    def do_POST(self):
        if self.path not in REWARD_PATHS:
            self.close_connection = True  # the body is left unread
            return self._error(HTTPStatus.NOT_FOUND, f"no such path {self.path!r} (POST {' or '.join(REWARD_PATHS)})")
        length = self.headers.get("Content-Length")
        if length is None or not length.isdigit():
            self.close_connection = True
            return self._error(HTTPStatus.LENGTH_REQUIRED, "a Content-Length header is required")
        length = int(length)
        if length > self.server.max_body:
            # Answer without reading the body, then drop the connection: the unread bytes cannot be reused.
            self.close_connection = True
            return self._error(HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                               f"body of {length} bytes exceeds the limit of {self.server.max_body} bytes")
        raw = self.rfile.read(length)
        try:
            payload = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            return self._error(HTTPStatus.BAD_REQUEST, f"body is not valid JSON: {e}")
        try:
            result = score_request(payload)
        except RequestError as e:
            return self._error(e.status, str(e))
        self._send(HTTPStatus.OK, result)

    def log_message(self, format, *args):  # one line per request would cost more than scoring it
        pass

    def log_error(self, format, *args):
        sys.stderr.write("reward server: " + (format % args) + "\n")


class RewardServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024  # every rollout request opens its own connection (OpenRLHF's client does)

    def __init__(self, host: str = "127.0.0.1", port: int = 0, max_body: int = DEFAULT_MAX_BODY):
        super().__init__((host, port), _Handler)
        self.max_body = max_body
        self.identity = reward_identity()

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"


def serve(host: str, port: int, max_body: int = DEFAULT_MAX_BODY) -> None:
    try:
        server = RewardServer(host, port, max_body)
    except OSError as e:
        raise HarnessError(f"reward server: cannot listen on {host}:{port} ({e.strerror or e})") from None
    print(f"reward server: serving {server.identity['reward']} at {server.url} "
          f"(POST {' or '.join(REWARD_PATHS)}, GET {HEALTH_PATH})", flush=True)
    with server:
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass


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
