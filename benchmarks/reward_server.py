"""Load test of the shared reward server on loopback: requests/s and p50/p99 latency at several client counts.

Starts the real server (`remax-bench serve-reward`, its own process) serving the rule or a reward model, then for
each client count C: C concurrent clients (keep-alive connections, spread over P client processes so the clients'
Python does not share one interpreter lock) send OpenRLHF reward requests of `--texts` texts each (3-digit
addition prompts, every other response right) until N requests are done or T seconds have passed. Every answer
is checked: status 200 and the expected rewards (the rule's own value; for a model, a direct `RewardModel.score`
of the same texts, within --tolerance, as batching with other requests changes the padding). The server's /health
counters give the requests per score call, which shows the batching.

    python benchmarks/reward_server.py                              # the rule; 1, 8 and 64 clients
    python benchmarks/reward_server.py --reward model               # a tiny reward model built here (CPU policy size)
    python benchmarks/reward_server.py --reward model --checkpoint DIR --json out.json
    python benchmarks/reward_server.py --slow-clients 128              # memory: 128 clients hold 8 MiB bodies half-sent
    python benchmarks/reward_server.py --slow-clients 128 --server-repo DIR   # the same against another checkout

`--slow-clients N` measures memory instead: N clients (threads here, one connection each) each announce a body of
`--slow-body-bytes` (default: the server's 8 MiB cap on one body), send half of it and stall. The server's RSS
(/proc/PID/status VmRSS; VmHWM its peak) and threads are read idle, while all N hold their bodies, and after they
close; each client's fate is counted (held open, or the status it was answered). The server must answer /health
after. `--server-repo` starts the server from another checkout (e.g. `git archive` of an older commit), to compare.
At most 1,024 clients and bodies of 64 MiB; it ends within `--duration` seconds of the clients' start.

Target (the rule, 8 clients): >= 1,000 requests/s with p99 < 50 ms. A model has no target: its figure is the
model's forward pass on this machine. Exit status: 0 when the target is met (or not measured), 1 when missed, 2
when the server could not be started or answered wrongly. Only loopback addresses are used. The figures depend on
the machine and its load (printed with them): rerun it where it matters.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import math
import multiprocessing as mp
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from harness import reward  # noqa: E402
from harness.inputs import task  # noqa: E402
from harness.io import atomic_path  # noqa: E402
from harness.reward.server import wait_healthy  # noqa: E402

TARGET_CLIENTS, TARGET_RPS, TARGET_P99_MS = 8, 1000.0, 50.0
TASK = {"kind": "addition", "digits": 3, "n_train": 512, "n_eval": 0, "seed": 0}
DISTINCT_PAYLOADS = 32


def tiny_reward_model(dest: str | Path, *, hidden_size: int = 64, intermediate_size: int = 256, num_layers: int = 2,
                      num_heads: int = 4, seed: int = 0) -> Path:
    """A randomly initialised Llama reward model (one-label sequence classification, the format verl and OpenRLHF
    load) with a tokenizer trained on the addition task, saved to `dest`. The defaults are the CPU profile's policy
    size, which a reward model trained here starts from. Its scores mean nothing: it exercises the serving path."""
    from transformers import LlamaConfig, LlamaForSequenceClassification

    from harness.inputs.policy import seed_everything, train_tokenizer

    tokenizer = train_tokenizer([r["prompt"] + r["answer"] for r in task.generate(TASK)], 64)
    seed_everything(seed)
    model = LlamaForSequenceClassification(LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=intermediate_size,
        num_hidden_layers=num_layers, num_attention_heads=num_heads, num_key_value_heads=num_heads,
        max_position_embeddings=64, num_labels=1, pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id))
    with atomic_path(dest, owner={"kind": "input", "name": "reward model"}) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
    return Path(dest)


def payloads(texts: int) -> list[dict]:
    """DISTINCT_PAYLOADS request bodies of `texts` texts each; every other response is the right answer."""
    rows = task.generate(TASK)
    out = []
    for k in range(DISTINCT_PAYLOADS):
        chunk = [rows[(k * texts + i) % len(rows)] for i in range(texts)]
        responses = [r["answer"] if i % 2 == 0 else str(int(r["answer"]) + 1) for i, r in enumerate(chunk)]
        out.append({"query": [r["prompt"] + s for r, s in zip(chunk, responses)],
                    "prompts": [r["prompt"] for r in chunk], "labels": [r["answer"] for r in chunk],
                    "responses": responses})
    return out


def expected_rewards(bodies: list[dict], checkpoint: Path | None, device: str, batch_size: int) -> list[list[float]]:
    if checkpoint is None:
        return [[reward.score(p, r, a) for p, r, a in zip(b["prompts"], b["responses"], b["labels"])] for b in bodies]
    from harness.reward.model import RewardModel

    model = RewardModel(checkpoint, device=device, batch_size=batch_size)
    return [model.score(b["prompts"], b["responses"]) for b in bodies]


def _client(port, bodies, expected, tolerance, first, n_requests, deadline, out, errors) -> None:
    headers = {"Content-Type": "application/json"}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        for i in range(first, first + n_requests):
            if time.monotonic() >= deadline:
                break
            k = i % len(bodies)
            t0 = time.perf_counter()
            conn.request("POST", "/get_reward", bodies[k], headers)
            resp = conn.getresponse()
            data = resp.read()
            out.append(time.perf_counter() - t0)
            got = json.loads(data).get("rewards") if resp.status == 200 else None
            if got is None or len(got) != len(expected[k]) or any(
                    not math.isclose(g, e, rel_tol=tolerance, abs_tol=tolerance) for g, e in zip(got, expected[k])):
                errors.append(f"HTTP {resp.status}: {data[:300]!r}, expected rewards {expected[k]}")
                return
    except OSError as e:
        errors.append(f"connection error: {e}")
    finally:
        conn.close()


def _process(port, bodies, expected, tolerance, first, threads, n_requests, deadline, queue) -> None:
    latencies, errors = [], []
    per_thread = [n_requests // threads + (i < n_requests % threads) for i in range(threads)]
    workers = [threading.Thread(target=_client, args=(port, bodies, expected, tolerance, first + 7 * i, n, deadline,
                                                      latencies, errors)) for i, n in enumerate(per_thread)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    queue.put((latencies, errors))


def _served(url: str) -> dict:
    return wait_healthy(url, 10)["served"]


def run(url: str, bodies, expected, tolerance, clients: int, processes: int, n_requests: int,
        duration_s: float) -> dict:
    port = int(url.rsplit(":", 1)[1])
    processes = min(processes, clients)
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    shares = [clients // processes + (i < clients % processes) for i in range(processes)]
    req_shares = [n_requests * s // clients for s in shares]
    before, load_before = _served(url), os.getloadavg()[0]
    deadline = time.monotonic() + duration_s
    procs = [ctx.Process(target=_process, args=(port, bodies, expected, tolerance, 101 * j, s, r, deadline, queue))
             for j, (s, r) in enumerate(zip(shares, req_shares))]
    t0 = time.perf_counter()
    for p in procs:
        p.start()
    results = [queue.get(timeout=duration_s + 120) for _ in procs]
    wall = time.perf_counter() - t0
    for p in procs:
        p.join()
    after = _served(url)
    latencies = sorted(x for lat, _ in results for x in lat)
    errors = [e for _, errs in results for e in errs]
    if not latencies:
        raise RuntimeError(f"no request completed: {errors[:3]}")
    calls = after["score_calls"] - before["score_calls"]
    pct = lambda q: 1000 * latencies[min(len(latencies) - 1, int(q * len(latencies)))]  # noqa: E731
    # Process start-up is inside `wall`, which understates the rate slightly: the figure errs on the safe side.
    return {
        "clients": clients, "client_processes": processes, "requests": len(latencies), "wall_s": wall,
        "requests_per_s": len(latencies) / wall, "texts_per_s": len(latencies) * len(expected[0]) / wall,
        "latency_ms": {"p50": pct(0.5), "p99": pct(0.99), "max": 1000 * latencies[-1],
                       "mean": 1000 * sum(latencies) / len(latencies)},
        "score_calls": calls,
        "requests_per_score_call": (after["requests"] - before["requests"]) / calls if calls else None,
        "overloaded": after["overloaded"] - before["overloaded"],
        "errors": errors[:5], "load_avg_1m": {"before": load_before, "after": os.getloadavg()[0]},
    }


def start_server(args, inputs: Path | None, stderr=None) -> tuple[subprocess.Popen, str]:
    cmd = [sys.executable, "-m", "harness.cli", "serve-reward", "--host", "127.0.0.1", "--port", "0",
           "--batch-size", str(args.batch_size), "--max-pending", str(args.max_pending), "--device", args.device]
    if inputs is not None:
        cmd += ["--inputs", str(inputs)]
    if args.max_connections is not None:  # a server from before #61 has no such option
        cmd += ["--max-connections", str(args.max_connections)]
    # With `-m`, the working directory comes first on sys.path: --server-repo's harness is the one served.
    server = subprocess.Popen(cmd, cwd=args.server_repo or REPO, stdout=subprocess.PIPE, stderr=stderr, text=True)
    line = server.stdout.readline()  # "reward server: serving ... at http://127.0.0.1:PORT (...)"
    match = re.search(r" at (http://127\.0\.0\.1:\d+) ", line)
    if not match:
        server.terminate()
        server.wait(timeout=10)
        raise RuntimeError(f"reward server did not start: {line!r}")
    wait_healthy(match.group(1), 60)
    return server, match.group(1)


MAX_SLOW_CLIENTS, MAX_SLOW_BODY = 1024, 64 << 20


def _memory(pid: int) -> dict:
    """The server's resident memory now and at its peak (MiB), and its threads, from /proc (Linux)."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return {"rss_mib": int(fields["VmRSS"].split()[0]) / 1024, "peak_rss_mib": int(fields["VmHWM"].split()[0]) / 1024,
            "threads": int(fields["Threads"])}


def _slow_client(port: int, body_bytes: int, deadline: float, socks: list, fates: list) -> None:
    """Announce a body of `body_bytes`, send half and stall: the fate is "held" while the server waits for the rest,
    else the status it answered (or the error that ended the connection)."""
    try:
        sock = socket.create_connection(("127.0.0.1", port), timeout=max(1.0, deadline - time.monotonic()))
    except OSError as e:
        fates.append(type(e).__name__)
        return
    socks.append(sock)
    try:
        sock.sendall(b"POST /get_reward HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: %d\r\n\r\n" % body_bytes)
        # An answer the server wrote before it closed can still be read once the send has failed.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(b" " * (body_bytes // 2))
        sock.settimeout(1.0)
        answer = sock.recv(64)
        fates.append(answer.split()[1].decode() if answer else "closed")
    except TimeoutError:
        fates.append("held")
    except OSError as e:
        fates.append(type(e).__name__)


def _hold(args: argparse.Namespace, server: subprocess.Popen, url: str) -> dict:
    """The server's memory idle, while the slow clients hold their bodies half-sent, and after they close."""
    socks: list = []
    fates: list[str] = []
    try:
        idle = _memory(server.pid)
        deadline = time.monotonic() + args.duration
        clients = [threading.Thread(target=_slow_client, args=(int(url.rsplit(":", 1)[1]), args.slow_body_bytes,
                                                               deadline, socks, fates))
                   for _ in range(args.slow_clients)]
        for c in clients:
            c.start()
        for c in clients:
            c.join(max(0.0, deadline - time.monotonic()))
        time.sleep(1.0)  # what the server received is in its buffers by now
        held = _memory(server.pid)
    finally:
        for sock in socks:
            sock.close()
    settle = time.monotonic() + 20  # its connection threads see the closes, log them and end
    while _memory(server.pid)["threads"] > idle["threads"] and time.monotonic() < settle:
        time.sleep(0.2)
    health = wait_healthy(url, 10)["served"]
    return {"memory": {"idle": idle, "held": held, "after": _memory(server.pid)},
            "fates": {f: fates.count(f) for f in sorted(set(fates))}, "health_after": health}


def slow_clients(args: argparse.Namespace) -> int:
    if not 1 <= args.slow_clients <= MAX_SLOW_CLIENTS or not 2 <= args.slow_body_bytes <= MAX_SLOW_BODY:
        print(f"--slow-clients: 1 to {MAX_SLOW_CLIENTS}; --slow-body-bytes: 2 to {MAX_SLOW_BODY}", file=sys.stderr)
        return 2
    with tempfile.TemporaryFile("w+") as log:  # the server's log: how many lines the aborted connections cost
        try:
            server, url = start_server(args, None, stderr=log)
        except Exception as e:
            print(e, file=sys.stderr)
            return 2
        try:
            measured = _hold(args, server, url)
        finally:
            server.terminate()
            server.wait(timeout=10)
        log.seek(0)
        lines = log.read().splitlines()
    result = {"server": str(Path(args.server_repo).resolve()) if args.server_repo else str(REPO),
              "slow_clients": args.slow_clients, "body_bytes": args.slow_body_bytes,
              "sent_bytes_each": args.slow_body_bytes // 2, **measured,
              "log": {"lines": len(lines), "tracebacks": sum(line.startswith("Traceback") for line in lines),
                      "first": lines[:2]},
              "host": os.uname().nodename, "cpu_count": os.cpu_count()}
    print(json.dumps(result, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reward", choices=["rule", "model"], default="rule")
    ap.add_argument("--checkpoint", type=Path, help="--reward model: this checkpoint (default: a tiny one built here)")
    ap.add_argument("--connections", "--clients", default="1,8,64",
                    help="concurrent clients, a comma-separated list of levels (default: %(default)s)")
    ap.add_argument("--texts", type=int, default=8, help="texts per request (default: %(default)s)")
    ap.add_argument("--processes", type=int, default=2, help="client processes the connections are spread over")
    ap.add_argument("--requests", type=int, default=20000, help="per level: stop after this many requests in all")
    ap.add_argument("--duration", type=float, default=8.0, help="per level: stop after this many seconds at most")
    ap.add_argument("--batch-size", type=int, default=64, help="the server's texts per score call")
    ap.add_argument("--max-pending", type=int, default=4096, help="the server's bound on waiting requests")
    ap.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto", help="where a reward model scores")
    ap.add_argument("--tolerance", type=float, default=1e-4,
                    help="a model's served score vs its direct score (padding differs between batches)")
    ap.add_argument("--json", help="also write the result to this file")
    ap.add_argument("--slow-clients", type=int, help="memory instead: this many clients hold a body half-sent")
    ap.add_argument("--slow-body-bytes", type=int, default=8 << 20, help="--slow-clients: each announced body")
    ap.add_argument("--server-repo", help="start the server from this checkout instead (to compare)")
    ap.add_argument("--max-connections", type=int, help="the server's bound on open connections (default: its own)")
    args = ap.parse_args()
    if args.slow_clients is not None:
        return slow_clients(args)
    levels = [int(c) for c in args.connections.split(",")]

    with tempfile.TemporaryDirectory(prefix="reward-bench-") as tmp:
        checkpoint = inputs = None
        if args.reward == "model":
            from harness.inputs import build_reward

            checkpoint = args.checkpoint or tiny_reward_model(Path(tmp) / "tiny-rm")
            inputs = Path(tmp) / "inputs"
            build_reward({"reward": {"kind": "model", "path": str(checkpoint), "sha256": None}}, inputs)
        bodies = payloads(args.texts)
        expected = expected_rewards(bodies, checkpoint, args.device, args.batch_size)
        encoded = [json.dumps({k: b[k] for k in ("query", "prompts", "labels")}).encode() for b in bodies]
        try:
            server, url = start_server(args, inputs)
        except Exception as e:
            print(e, file=sys.stderr)
            return 2
        try:
            identity = wait_healthy(url, 10)
            levels_out = [run(url, encoded, expected, args.tolerance, c, args.processes, args.requests,
                              args.duration) for c in levels]
        finally:
            server.terminate()
            server.wait(timeout=10)
    result = {
        "reward": {k: identity[k] for k in ("kind", "reward", "sha256")},
        "payload": f"{args.texts} texts per request (3-digit addition prompt + answer, every other answer right), "
                   f"{DISTINCT_PAYLOADS} distinct bodies of ~{sum(map(len, encoded)) // len(encoded)} bytes",
        "server": {"batch_size": args.batch_size, "max_pending": args.max_pending, "device": args.device},
        "cpu_count": os.cpu_count(), "levels": levels_out,
    }
    target = next((lv for lv in levels_out if lv["clients"] == TARGET_CLIENTS), None)
    if args.reward == "rule" and target is not None:
        result["target"] = {"clients": TARGET_CLIENTS, "requests_per_s": TARGET_RPS, "p99_ms": TARGET_P99_MS}
        result["met"] = target["requests_per_s"] >= TARGET_RPS and target["latency_ms"]["p99"] < TARGET_P99_MS
    print(json.dumps(result, indent=2))
    print(f"\n{result['reward']['kind']} reward, {result['payload']}")
    print(f"{'clients':>7} {'req/s':>8} {'texts/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'req/call':>8} {'load 1m':>8}")
    for lv in levels_out:
        print(f"{lv['clients']:>7} {lv['requests_per_s']:>8.0f} {lv['texts_per_s']:>8.0f} "
              f"{lv['latency_ms']['p50']:>8.2f} {lv['latency_ms']['p99']:>8.2f} "
              f"{lv['requests_per_score_call'] or 0:>8.2f} {lv['load_avg_1m']['after']:>8.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    if any(lv["errors"] for lv in levels_out):
        return 2
    return 0 if result.get("met", True) else 1


if __name__ == "__main__":
    sys.exit(main())
