"""The shared reward server: real HTTP on loopback, OpenRLHF's remote reward protocol, bad requests answered 4xx."""

import http.client
import json
import socket
import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import BIN, REPO, run_cli
from harness import HarnessError, reward
from harness.io import sha256_file
from harness.reward_server import RewardServer, wait_healthy


@pytest.fixture
def server():
    srv = RewardServer("127.0.0.1", 0, max_body=4096)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def post(srv, body, path="/get_reward", conn=None, headers=None):
    conn = conn or http.client.HTTPConnection(*srv.server_address[:2], timeout=10)
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    conn.request("POST", path, data, {"Content-Type": "application/json", **(headers or {})})
    resp = conn.getresponse()
    return resp.status, json.loads(resp.read())


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
    assert answer["status"] == "ok" and answer["reward"] == "harness.reward.score"
    assert answer["sha256"] == sha256_file(REPO / "harness" / "reward.py")


@pytest.mark.parametrize("body, status, message", [
    (b"{not json", 400, "not valid JSON"),
    (b"\xff\xfe", 400, "not valid JSON"),
    ([1, 2], 400, "expected a JSON object"),
    ({"query": ["1"], "prompts": ["1"]}, 400, "missing field(s): labels"),
    ({"query": "12+3=15", "prompts": ["12+3="], "labels": ["15"]}, 400, "'query' must be a list of strings"),
    ({"query": [1], "prompts": ["1"], "labels": ["1"]}, 400, "'query' must be a list of strings"),
    ({"query": ["1=2", "3=4"], "prompts": ["1="], "labels": ["2", "4"]}, 400, "same length, got query=2, prompts=1"),
    ({"query": ["9+9=18"], "prompts": ["1+1="], "labels": ["2"]}, 422, "query[0] does not begin with prompts[0]"),
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
