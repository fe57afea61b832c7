"""The shared reward server: real HTTP on loopback, OpenRLHF's remote reward protocol, bad requests answered 4xx,
concurrent requests batched into one score call, a bounded queue, a tiny real reward model served."""

import contextlib
import http.client
import json
import socket
import struct
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import BIN, REPO, run_cli

from harness import HarnessError, cli, reward
from harness.inputs import REWARD_RECORD_ROLE, build_reward, resolve_reward
from harness.io import record_hash, sha256_file, sha256_tree, write_json
from harness.reward.model import RewardModel
from harness.reward.server import RewardServer, wait_healthy
from harness.reward.shared import SharedReward, load_shared_reward, rule_identity

sys.path.append(str(REPO / "benchmarks"))
from reward_server import tiny_reward_model

RULE = load_shared_reward({"kind": "rule"})


@contextlib.contextmanager
def serving(shared_reward=RULE, **limits):
    srv = RewardServer("127.0.0.1", 0, shared_reward, **limits)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()


@pytest.fixture
def server():
    with serving(max_body=4096) as srv:
        yield srv


def post(srv, body, path="/get_reward", conn=None, headers=None, full=False):
    conn = conn or http.client.HTTPConnection(*srv.server_address[:2], timeout=10)
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    conn.request("POST", path, data, {"Content-Type": "application/json", **(headers or {})})
    resp = conn.getresponse()
    answer = json.loads(resp.read())
    return (resp.status, answer, resp) if full else (resp.status, answer)


def good(prompts=("12+34=", "7>"), responses=("46", "x7"), labels=("46", "7")):
    return {"query": [p + r for p, r in zip(prompts, responses)], "prompts": list(prompts), "labels": list(labels)}


def test_scores_with_the_shared_reward(server):
    prompts, responses, labels = ("12+34=", "5+5=", "98>"), ("46", " 19 ", "88"), ("46", "10", "89")
    status, body = post(server, good(prompts, responses, labels))
    assert status == 200
    expected = [reward.score(p, r, a) for p, r, a in zip(prompts, responses, labels)]
    assert body["rewards"] == expected == body["scores"]
    assert expected == [1.0, 0.5, 0.5]  # the cases cover a right, a partly right and a half right answer
    assert body["extra_logs"] == {"exact_match": [1.0, 0.0, 0.0]}


def test_health_names_the_reward_and_its_hash(server):
    answer = wait_healthy(server.url, 5)
    assert answer["status"] == "ok" and answer["reward"] == "harness.reward.score" and answer["kind"] == "rule"
    assert answer["sha256"] == sha256_file(REPO / "harness" / "reward" / "__init__.py")
    post(server, good())
    served = wait_healthy(server.url, 5)["served"]
    assert served.pop("connections") >= 1  # this health check's own, and the post's until its thread ends
    assert served == {"requests": 1, "texts": 2, "score_calls": 1, "failed_calls": 0, "overloaded": 0, "waiting": 0,
                      "over_budget": 0, "connections_refused": 0, "buffered_bytes": 0}


@pytest.mark.parametrize("body, status, message", [
    (b"{not json", 400, "not valid JSON"),
    (b"\xff\xfe", 400, "not valid JSON"),
    ([1, 2], 400, "expected a JSON object"),
    ({"query": ["1"], "prompts": ["1"]}, 400, "missing field(s): labels"),
    ({"query": "12+3=15", "prompts": ["12+3="], "labels": ["15"]}, 400, "'query' must be a list of strings"),
    ({"query": [1], "prompts": ["1"], "labels": ["1"]}, 400, "'query' must be a list of strings"),
    ({"query": ["1=2", "3=4"], "prompts": ["1="], "labels": ["2", "4"]}, 400, "same length, got query=2, prompts=1"),
    ({"query": ["9+9=18"], "prompts": ["1+1="], "labels": ["2"]}, 422, "query[0] does not begin with prompts[0]"),
    # JSON may escape a lone surrogate, which no tokenizer encodes: scored, it would fail its whole batch with a 500.
    (b'{"query": ["1+1=2\\ud800"], "prompts": ["1+1="], "labels": ["2"]}', 400,
     "query[0] is not Unicode text: a lone surrogate '\\ud800' at index 5"),
])
def test_bad_requests_get_4xx_and_the_server_keeps_serving(server, body, status, message):
    conn = http.client.HTTPConnection(*server.server_address[:2], timeout=10)
    got, answer = post(server, body, conn=conn)
    assert (got, message in answer["error"]) == (status, True), answer
    # The same connection, then a new one, still get answers.
    assert post(server, good(), conn=conn)[0] == 200
    assert post(server, good())[0] == 200


def test_huge_body_is_refused_without_being_read(server):
    status, answer = post(server, b"x" * 5000)
    assert status == 413 and "exceeds the limit of 4096 bytes" in answer["error"]
    assert post(server, good())[0] == 200


def test_missing_length_and_unknown_paths(server):
    sock = socket.create_connection(server.server_address[:2], timeout=10)
    sock.sendall(b"POST /get_reward HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
    head = sock.makefile("rb").read().decode()  # the server closes the connection after answering
    sock.close()
    assert head.startswith("HTTP/1.1 411") and "Content-Length header is required" in head
    assert post(server, good(), path="/score")[0] == 404
    conn = http.client.HTTPConnection(*server.server_address[:2], timeout=10)
    conn.request("GET", "/nope")
    assert conn.getresponse().status == 404
    assert post(server, good(), path="/")[0] == 200


@pytest.mark.parametrize("length", ["abc", "\u00b2", "1e3", "-1", "99999999999999999999999"])
def test_a_bad_content_length_gets_400_not_a_dropped_connection(server, length):
    sock = socket.create_connection(server.server_address[:2], timeout=10)
    sock.sendall(b"POST /get_reward HTTP/1.1\r\nHost: x\r\nContent-Length: " + length.encode() + b"\r\n\r\n{}")
    answer = sock.makefile("rb").read().decode()  # the server answers, then closes: the body's extent is unknown
    sock.close()
    assert answer.startswith("HTTP/1.1 400") and "is not a byte count" in answer, answer
    assert post(server, good())[0] == 200


def test_json_nested_past_the_parsers_limit_gets_400():
    with serving(max_body=1 << 20) as srv:
        status, answer = post(srv, b"[" * 100_000 + b"]" * 100_000)
        assert status == 400 and "nested too deep" in answer["error"]
        assert post(srv, good())[0] == 200


def test_an_integer_too_long_to_convert_gets_400():
    # Python's json reads an integer with int(), which refuses more than 4300 digits (sys.get_int_max_str_digits).
    with serving(max_body=1 << 20) as srv:
        status, answer = post(srv, b'{"query": [], "prompts": [], "labels": [], "n": -' + b"9" * 5000 + b"}")
        assert status == 400 and "a number in the body cannot be parsed" in answer["error"], answer
        assert post(srv, good())[0] == 200


def answer_then_close(sock):
    """The status and JSON body of the answer the server wrote before it closed the connection."""
    raw = sock.makefile("rb").read()  # returns only once the server has closed the connection
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 ") and b"Content-Type: application/json" in head, raw
    return int(head.split()[1]), json.loads(body)


@pytest.mark.parametrize("request_bytes, status, message", [
    (b"NONSENSE\r\n\r\n", 400, "Bad request syntax ('NONSENSE')"),
    (b"PUT /get_reward HTTP/1.1\r\nHost: x\r\n\r\n", 501, "Unsupported method ('PUT')"),
    (b"GET /health HTTP/2.0\r\n\r\n", 505, "Invalid HTTP version (2.0)"),
])
def test_a_request_the_http_parser_refuses_gets_a_json_error(server, request_bytes, status, message):
    with socket.create_connection(server.server_address[:2], timeout=5) as sock:
        sock.sendall(request_bytes)
        assert answer_then_close(sock) == (status, {"error": message})
    assert post(server, good())[0] == 200


REQUEST_TIMEOUT_S = 1.0


def stall(srv, first, trickle):
    """Send `first`, then a byte of `trickle` every 0.3 s, then nothing: the answer, and the seconds it took.
    Each pause is shorter than the timeout, so only a bound on the request as a whole answers by ~1 s."""
    with socket.create_connection(srv.server_address[:2], timeout=5) as sock:
        start = time.monotonic()
        sock.sendall(first)
        for byte in trickle:
            time.sleep(0.3)
            sock.sendall(bytes([byte]))
        answer = answer_then_close(sock)
        return answer, time.monotonic() - start


def test_a_body_sent_too_slowly_gets_408_within_the_request_timeout():
    with serving(request_timeout_s=REQUEST_TIMEOUT_S) as srv:
        (status, answer), took = stall(srv, b"POST /get_reward HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{",
                                       b"  ")
        assert status == 408 and answer["error"] == "the request did not arrive within 1 s of its first byte"
        # A timeout of each read alone would answer 1 s after the last byte, at 1.6 s.
        assert REQUEST_TIMEOUT_S - 0.1 < took < REQUEST_TIMEOUT_S + 0.5, took
        assert post(srv, good())[0] == 200


@pytest.mark.parametrize("first, trickle", [
    (b"PO", b"ST"),  # the request line
    (b"POST /get_reward HTTP/1.1\r\n", b"Ho"),  # the headers
])
def test_a_request_line_or_headers_sent_too_slowly_get_408_not_a_silent_close(first, trickle):
    with serving(request_timeout_s=REQUEST_TIMEOUT_S) as srv:
        (status, answer), took = stall(srv, first, trickle)
        assert status == 408 and answer["error"] == "the request did not arrive within 1 s of its first byte"
        assert REQUEST_TIMEOUT_S - 0.1 < took < REQUEST_TIMEOUT_S + 0.5, took
        assert post(srv, good())[0] == 200


def test_concurrent_clients_get_their_own_answers(server):
    def one(i):
        prompt, answer = f"{i}+{i}=", str(2 * i)
        response = answer if i % 2 else answer[::-1] + "9"
        status, body = post(server, good([prompt], [response], [answer]))
        return status, body["rewards"][0], reward.score(prompt, response, answer)

    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(one, range(200)))
    assert all(status == 200 and got == want for status, got, want in results)


def test_wait_healthy_gives_up_with_a_clear_error():
    with socket.socket() as s:  # a port with nothing listening on it
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(HarnessError, match=f"127.0.0.1:{port}: not healthy after 0.5 s"):
        wait_healthy(f"http://127.0.0.1:{port}", 0.5)


def test_serve_reward_command_serves_until_stopped():
    """The real console script: start, health check (its own --health-check mode), one request, stop."""
    proc = subprocess.Popen([str(BIN / "remax-bench"), "serve-reward", "--port", "0"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        url = line.split(" at ", 1)[1].split()[0]
        check = run_cli("serve-reward", "--health-check", url, "--timeout", "20")
        assert check.returncode == 0 and "healthy (harness.reward.score" in check.stdout
        host, port = url.removeprefix("http://").split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=10)
        conn.request("POST", "/get_reward", json.dumps(good()))
        assert json.loads(conn.getresponse().read())["rewards"] == [1.0, 0.0]
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    dead = run_cli("serve-reward", "--health-check", url, "--timeout", "0.5")
    assert dead.returncode == 2 and "not healthy" in dead.stderr


def test_port_in_use_is_a_clear_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        proc = run_cli("serve-reward", "--port", port)
    assert proc.returncode == 2 and f"cannot listen on 127.0.0.1:{port}" in proc.stderr


# --- batching, the bounded queue, scoring errors: a real scorer behind the real server ---

class Recorder:
    """A real batched scorer: the reward is the response read as a number (so a request handed another request's
    slice shows), each call's size is recorded, and a call takes `delay` seconds, like a forward pass. With a
    `gate`, every call waits for it to open (the test then knows what is queued)."""

    def __init__(self, delay=0.0, gate=False, fail_on=None):
        self.delay, self.fail_on = delay, fail_on
        self.gate = threading.Event() if gate else None
        self.entered = threading.Event()
        self.calls = []

    def __call__(self, prompts, responses, answers):
        self.calls.append(len(prompts))
        self.entered.set()
        if self.gate is not None:
            assert self.gate.wait(20), "the test never opened the gate"
        time.sleep(self.delay)
        if self.fail_on in responses:
            raise RuntimeError(f"cannot score {self.fail_on!r}")
        return [float(r) for r in responses]


def shared(scorer):
    return SharedReward({"kind": "test", "reward": "tests.Recorder", "sha256": "0" * 64}, scorer)


def numbered(*values):
    """One request whose rewards (under Recorder) are `values`."""
    return good([f"{v}+0=" for v in values], [str(v) for v in values], [str(v) for v in values])


def waiting_reaches(srv, n, timeout_s=20):
    deadline = time.monotonic() + timeout_s
    while wait_healthy(srv.url, 5)["served"]["waiting"] != n:
        assert time.monotonic() < deadline, f"{n} requests never queued"
        time.sleep(0.01)


def test_concurrent_requests_are_scored_in_fewer_calls():
    n = 24
    scorer = Recorder(delay=0.05)
    with serving(shared(scorer)) as srv:
        barrier = threading.Barrier(n)

        def one(i):
            conn = http.client.HTTPConnection(*srv.server_address[:2], timeout=20)
            conn.connect()
            barrier.wait()  # all requests leave together, as a rollout's do
            return post(srv, numbered(2 * i, 2 * i + 1), conn=conn)

        with ThreadPoolExecutor(n) as pool:
            results = list(pool.map(one, range(n)))
        served = wait_healthy(srv.url, 5)["served"]
    assert results == [(200, {"rewards": [2.0 * i, 2.0 * i + 1], "scores": [2.0 * i, 2.0 * i + 1],
                                           "extra_logs": {"exact_match": [1.0, 1.0]}}) for i in range(n)]
    assert sum(scorer.calls) == 2 * n and len(scorer.calls) < n, scorer.calls
    assert served["score_calls"] == len(scorer.calls) and served["requests"] == n


def test_queued_requests_form_one_batch_of_at_most_max_batch_texts():
    scorer = Recorder(gate=True)
    with serving(shared(scorer), max_batch=5) as srv, ThreadPoolExecutor(8) as pool:
        first = pool.submit(post, srv, numbered(0))
        assert scorer.entered.wait(20)
        # Queued while the scorer is busy, in this order: 2, 2, 1 texts fit in 5; then 6 texts (over max_batch)
        # go alone; then 3.
        rest = []
        for values in ((1, 2), (3, 4), (5,), (6, 7, 8, 9, 10, 11), (12, 13, 14)):
            rest.append(pool.submit(post, srv, numbered(*values)))
            waiting_reaches(srv, len(rest))
        scorer.gate.set()
        answers = [f.result() for f in [first, *rest]]
    assert [(status, body["rewards"]) for status, body in answers] == [
        (200, [0.0]), (200, [1.0, 2.0]), (200, [3.0, 4.0]), (200, [5.0]), (200, [6.0, 7.0, 8.0, 9.0, 10.0, 11.0]),
        (200, [12.0, 13.0, 14.0])]
    assert scorer.calls == [1, 5, 6, 3]


def test_overload_answers_503_at_once_and_the_server_keeps_serving():
    scorer = Recorder(gate=True)
    with serving(shared(scorer), max_pending=2) as srv, ThreadPoolExecutor(3) as pool:
        busy = pool.submit(post, srv, numbered(1))
        assert scorer.entered.wait(20)
        queued = [pool.submit(post, srv, numbered(v)) for v in (2, 3)]
        waiting_reaches(srv, 2)
        # The gate is still shut: a request that waited for the scorer would time out here instead of answering.
        status, body, resp = post(srv, numbered(4), full=True)
        assert status == 503 and resp.getheader("Retry-After") == "1"
        assert body["error"].startswith("overloaded: 2 requests already wait to be scored (the limit, "
                                        "--max-pending 2)"), body
        scorer.gate.set()
        assert [f.result()[1]["rewards"] for f in (busy, *queued)] == [[1.0], [2.0], [3.0]]
        assert post(srv, numbered(5)) == (200, {"rewards": [5.0], "scores": [5.0],
                                                "extra_logs": {"exact_match": [1.0]}})
        served = wait_healthy(srv.url, 5)["served"]
    assert served["overloaded"] == 1 and served["requests"] == 4 and served["waiting"] == 0


def test_a_scoring_error_answers_500_to_its_whole_batch_and_the_next_request_works():
    scorer = Recorder(gate=True, fail_on="13")
    with serving(shared(scorer)) as srv, ThreadPoolExecutor(3) as pool:
        first = pool.submit(post, srv, numbered(1))
        assert scorer.entered.wait(20)
        bad = pool.submit(post, srv, numbered(13))
        waiting_reaches(srv, 1)
        batch_mate = pool.submit(post, srv, numbered(2))
        waiting_reaches(srv, 2)
        scorer.gate.set()
        assert first.result()[0] == 200
        for answer in (bad.result(), batch_mate.result()):
            assert answer == (500, {"error": "scoring failed (tests.Recorder): RuntimeError: cannot score '13'"})
        assert post(srv, numbered(3))[1]["rewards"] == [3.0]
        assert wait_healthy(srv.url, 5)["served"]["failed_calls"] == 1
    assert scorer.calls == [1, 2, 1]


def test_a_scorer_answering_the_wrong_count_is_a_500():
    with serving(shared(lambda prompts, responses, answers: [0.0])) as srv:
        assert post(srv, numbered(1, 2)) == (500, {"error": "scoring failed (tests.Recorder): ValueError: the shared "
                                                            "reward returned 1 scores for 2 texts"})
        assert post(srv, numbered(1))[0] == 200


# --- a real (tiny) reward model ---

@pytest.fixture(scope="module")
def tiny_rm(tmp_path_factory):
    root = tmp_path_factory.mktemp("reward-model")
    checkpoint = tiny_reward_model(root / "checkpoint", hidden_size=16, intermediate_size=32, num_layers=1,
                                   num_heads=2)
    build_reward({"reward": {"kind": "model", "path": str(checkpoint), "sha256": None}}, root / "inputs")
    return {"checkpoint": checkpoint, "inputs": root / "inputs"}


RM_PROMPTS, RM_RESPONSES = ("12+34=", "5+5=", "98+1=", "7+8="), ("46", "11", "99", "1")
RM_LABELS = ("46", "10", "99", "15")


def test_served_scores_equal_the_reward_models_own(tiny_rm):
    reward_input = resolve_reward(tiny_rm["inputs"])
    direct = RewardModel(tiny_rm["checkpoint"], device="cpu", batch_size=64)
    with serving(load_shared_reward(reward_input, device="cpu", batch_size=64)) as srv:
        health = wait_healthy(srv.url, 5)
        status, body = post(srv, good(RM_PROMPTS, RM_RESPONSES, RM_LABELS))
        # One at a time, concurrently: batched with other requests, so padded differently than scored alone.
        with ThreadPoolExecutor(8) as pool:
            singles = list(pool.map(lambda i: post(srv, good([RM_PROMPTS[i % 4]], [RM_RESPONSES[i % 4]],
                                                                [RM_LABELS[i % 4]])), range(16)))
    assert (health["kind"], health["reward"], health["sha256"]) == ("model", reward_input["path"],
                                                                    reward_input["sha256"])
    expected = direct.score(RM_PROMPTS, RM_RESPONSES)
    assert status == 200 and body["rewards"] == expected == body["scores"]
    assert len(set(expected)) == len(expected)  # the model tells the texts apart: the comparison means something
    assert body["extra_logs"] == {"exact_match": [1.0, 0.0, 1.0, 0.0]}  # the task's truth, not the model's view
    for i, (status, answer) in enumerate(singles):
        assert status == 200 and answer["rewards"] == [pytest.approx(expected[i % 4], abs=1e-5)]


def test_serve_reward_command_serves_the_recorded_reward_model(tiny_rm):
    proc = subprocess.Popen([str(BIN / "remax-bench"), "serve-reward", "--port", "0", "--inputs", tiny_rm["inputs"],
                             "--device", "cpu", "--batch-size", "16", "--max-pending", "8"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert "model reward" in line and "up to 16 texts per score call, 8 requests waiting" in line, line
        url = line.split(" at ", 1)[1].split()[0]
        health = wait_healthy(url, 30)
        host, port = url.removeprefix("http://").split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=30)
        conn.request("POST", "/get_reward", json.dumps(good(RM_PROMPTS, RM_RESPONSES, RM_LABELS)))
        rewards = json.loads(conn.getresponse().read())["rewards"]
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    assert health["kind"] == "model" and health["sha256"] == resolve_reward(tiny_rm["inputs"])["sha256"]
    assert rewards == RewardModel(tiny_rm["checkpoint"], device="cpu", batch_size=16).score(RM_PROMPTS, RM_RESPONSES)


def test_serve_reward_refuses_a_bad_reward_input_before_listening(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")  # what serve-reward sets, restored after the test
    # In this process (the CLI's main; it would serve forever, were the input good) ...
    assert cli.main(["serve-reward", "--inputs", str(tmp_path / "nowhere")]) == 2
    out = capsys.readouterr()
    assert f"{tmp_path / 'nowhere' / 'reward'}: input is missing" in out.err and "serving" not in out.out
    with pytest.raises(SystemExit) as refused:  # argparse's refusal: exit 2, naming the flag
        cli.main(["serve-reward", "--batch-size", "0"])
    out = capsys.readouterr()
    assert refused.value.code == 2 and "--batch-size: at least 1, not 0" in out.err and "serving" not in out.out
    # ... and the console script: a recorded reward whose checkpoint is a causal LM, not a reward model.
    reward_dir = tmp_path / "inputs" / "reward"
    (reward_dir / "model").mkdir(parents=True)
    (reward_dir / "model" / "config.json").write_text(json.dumps({"model_type": "llama",
                                                                  "architectures": ["LlamaForCausalLM"]}))
    write_json(reward_dir / "reward.json", {"kind": "model", "sha256": sha256_tree(reward_dir / "model")},
               role=REWARD_RECORD_ROLE)
    record_hash(reward_dir)
    causal = run_cli("serve-reward", "--inputs", tmp_path / "inputs")
    assert causal.returncode == 2 and "must be a *ForSequenceClassification checkpoint" in causal.stderr
    assert "serving" not in causal.stdout


def test_the_rule_identity_is_served_without_inputs(server):
    assert {k: wait_healthy(server.url, 5)[k] for k in ("kind", "reward", "sha256")} == rule_identity()


def test_the_frameworks_client_gets_the_served_models_scores_and_the_rule_without_a_url(tiny_rm):
    """harness.reward.score_batch, which the DeepSpeed-Chat launcher and the TRL trainer score with: over HTTP from a
    served reward model, the model's own scores; without a URL, the rule in the process."""
    prompts, responses, labels = list(RM_PROMPTS), list(RM_RESPONSES), list(RM_LABELS)
    direct = RewardModel(tiny_rm["checkpoint"], device="cpu", batch_size=64)
    with serving(load_shared_reward(resolve_reward(tiny_rm["inputs"]), device="cpu", batch_size=64)) as srv:
        served = reward.score_batch(prompts, responses, labels, srv.url + "/get_reward")
    assert served == pytest.approx(direct.score(prompts, responses), abs=1e-5)
    assert reward.score_batch(prompts, responses, labels) == [reward.score(*t) for t in zip(prompts, responses, labels)]


# --- memory bounds, client disconnects, the command line's ranges (#61) ---

def until(predicate, timeout_s=5):
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "the server never got there"
        time.sleep(0.01)


def served(srv):
    return wait_healthy(srv.url, 5)["served"]


def half_sent(srv, length, sent=100):
    """A connection that announced a body of `length` bytes and sent `sent` of them (spaces, which JSON allows
    before a value): the server holds its request open, waiting for the rest."""
    sock = socket.create_connection(srv.server_address[:2], timeout=5)
    sock.sendall(b"POST /get_reward HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % length + b" " * sent)
    return sock


def padded(length, sent=100):
    """The rest of a half_sent body: a good request, padded with spaces to `length` bytes in all."""
    return json.dumps(good()).encode().ljust(length - sent)


def refusal(sock):
    """The whole answer the server wrote before it closed the connection: (status, Retry-After, error)."""
    raw = sock.makefile("rb").read()
    head, _, body = raw.partition(b"\r\n\r\n")
    retry = next((line.split(b":", 1)[1].strip().decode() for line in head.split(b"\r\n")
                  if line.lower().startswith(b"retry-after:")), None)
    return int(head.split()[1]), retry, json.loads(body)["error"]


def reset(sock):
    """Close with an RST, as a killed client or a dropped network does, instead of an orderly FIN."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def kept_alive_answer(sock):
    """The status and rewards of one answer on a kept-alive connection."""
    resp = http.client.HTTPResponse(sock)
    resp.begin()
    return resp.status, json.loads(resp.read())["rewards"]


def test_bodies_held_across_connections_are_capped_and_the_budget_is_released_after():
    with serving(max_body=4096, max_buffered_bytes=3 * 4096) as srv:
        held = [half_sent(srv, 4000) for _ in range(3)]
        until(lambda: served(srv)["buffered_bytes"] == 12000)
        with half_sent(srv, 4000, sent=0) as over:  # 16,000 bytes held would pass the 12,288 allowed
            assert refusal(over) == (503, "1", "overloaded: 12000 bytes of request bodies are held (--max-buffered-"
                                               "bytes 12288 in all); this one's 4000 would pass it; retry in 1 s")
        held[0].sendall(padded(4000))
        assert kept_alive_answer(held[0]) == (200, [1.0, 0.0])
        reset(held[1])
        held[2].close()
        until(lambda: served(srv)["buffered_bytes"] == 0)
        assert post(srv, b" " * 100 + padded(4000))[0] == 200
        assert served(srv)["over_budget"] == 1
        held[0].close()


def test_connections_past_the_cap_get_503_at_once_and_the_server_keeps_serving():
    with serving(max_connections=2) as srv:
        held = [half_sent(srv, 4000) for _ in range(2)]  # accepted in order: both are open before the third
        with socket.create_connection(srv.server_address[:2], timeout=5) as third:
            assert refusal(third) == (503, "1", "overloaded: 2 connections are open (--max-connections 2); "
                                                "retry in 1 s")
        for sock in held:
            sock.close()

        def serves():
            with contextlib.suppress(OSError, http.client.HTTPException):
                return post(srv, good())[0] == 200
            return False

        until(serves)
        assert served(srv)["connections_refused"] >= 1


def request_bytes(body):
    return b"POST /get_reward HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body) + body


@pytest.mark.parametrize("when", ["reset during the body", "closed during the body", "reset before the answer",
                                  "reset while idle"])
def test_a_client_that_disconnects_is_one_log_line(when, capsys):
    scorer = Recorder(gate=when == "reset before the answer")
    with serving(shared(scorer)) as srv:
        if when.endswith("during the body"):
            sock = half_sent(srv, 4000)
            until(lambda: served(srv)["buffered_bytes"] == 4000)
        else:
            sock = socket.create_connection(srv.server_address[:2], timeout=5)
            sock.sendall(request_bytes(json.dumps(numbered(1)).encode()))
            if scorer.gate is not None:
                assert scorer.entered.wait(20)
            else:
                assert kept_alive_answer(sock) == (200, [1.0])
        if when.startswith("closed"):
            sock.close()
        else:
            reset(sock)
        if scorer.gate is not None:
            scorer.gate.set()
        until(lambda: served(srv)["connections"] == 1)  # only this health check's own: the handler is done
        err = capsys.readouterr().err
        assert post(srv, numbered(2))[0] == 200
    lines = err.splitlines()
    assert len(lines) == 1 and "disconnected" in lines[0] and "Traceback" not in err, err


@pytest.mark.parametrize("argv, said", [
    (["--host", ""], "argument --host: a value, not an empty"),
    (["--health-check", ""], "argument --health-check: a value, not an empty"),
    (["--inputs", ""], "argument --inputs: a value, not an empty"),
    (["--health-check", "127.0.0.1:8000"], "argument --health-check: a URL starting with http:// or https://"),
    (["--max-body-bytes", "99999999999999999999"], "argument --max-body-bytes: at most 1073741824, not "
                                                   "99999999999999999999"),
    (["--max-buffered-bytes", "0"], "argument --max-buffered-bytes: at least 1, not 0"),
    (["--max-connections", "70000"], "argument --max-connections: at most 65536, not 70000"),
    (["--max-length", "99999999999"], "argument --max-length: at most 1048576, not 99999999999"),
    (["--max-length", "4"], "argument --max-length: at least 8, not 4"),
    (["--max-pending", "1000000"], "argument --max-pending: at most 65536, not 1000000"),
    (["--batch-size", "100000"], "argument --batch-size: at most 65536, not 100000"),
])
def test_serve_reward_refuses_an_empty_value_or_a_number_out_of_range_naming_the_option(argv, said, capsys):
    with pytest.raises(SystemExit) as refused:  # parsing only: whatever got through is never served
        cli.parser().parse_args(["serve-reward", *argv])
    err = capsys.readouterr().err
    assert refused.value.code == 2 and said in err, err


def test_serve_reward_refuses_a_total_budget_below_one_body(capsys):
    assert cli.main(["serve-reward", "--max-body-bytes", "2048", "--max-buffered-bytes", "1024"]) == 2
    out = capsys.readouterr()
    assert ("--max-buffered-bytes 1024 is less than --max-body-bytes 2048: no body that large could ever be read"
            in out.err) and "serving" not in out.out
