"""Load test of the shared reward server on loopback: requests/s and latency for single-sample requests.

Starts the real server (`remax-bench serve-reward`, its own process), then C concurrent clients (keep-alive
connections, spread over P client processes so the clients' Python does not share one interpreter lock) send
single-sample OpenRLHF reward requests until N requests are done or T seconds have passed, whichever comes first.
Every answer is checked (status 200 and the expected reward). Target: >= 1,000 requests/s with p99 < 50 ms.

    python benchmarks/reward_server.py                  # defaults: 8 connections, 2 processes, 20,000 requests, 30 s
    python benchmarks/reward_server.py --connections 32 --requests 50000 --json out.json

Exit status: 0 when the target is met, 1 when not, 2 when the server could not be started or answered wrongly.
Only loopback addresses are used. The figure depends on the machine and its load: rerun it where it matters.
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from harness import reward  # noqa: E402
from harness.reward_server import wait_healthy  # noqa: E402

TARGET_RPS = 1000.0
TARGET_P99_MS = 50.0
PROMPT, RESPONSE, LABEL = "37+45=", "82", "82"


def _client(port: int, n_requests: int, deadline: float, out: list, errors: list) -> None:
    body = json.dumps({"query": [PROMPT + RESPONSE], "prompts": [PROMPT], "labels": [LABEL]}).encode()
    headers = {"Content-Type": "application/json"}
    expected = reward.score(PROMPT, RESPONSE, LABEL)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        for _ in range(n_requests):
            if time.monotonic() >= deadline:
                break
            t0 = time.perf_counter()
            conn.request("POST", "/get_reward", body, headers)
            resp = conn.getresponse()
            data = resp.read()
            out.append(time.perf_counter() - t0)
            if resp.status != 200 or json.loads(data)["rewards"] != [expected]:
                errors.append(f"HTTP {resp.status}: {data[:200]!r}")
                return
    except OSError as e:
        errors.append(f"connection error: {e}")
    finally:
        conn.close()


def _process(port: int, threads: int, n_requests: int, deadline: float, queue) -> None:
    latencies, errors = [], []
    per_thread = [n_requests // threads + (i < n_requests % threads) for i in range(threads)]
    workers = [threading.Thread(target=_client, args=(port, n, deadline, latencies, errors)) for n in per_thread]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    queue.put((latencies, errors))


def run(connections: int, processes: int, n_requests: int, duration_s: float, port: int) -> dict:
    processes = min(processes, connections)
    queue = mp.get_context("spawn").Queue()
    deadline = time.monotonic() + duration_s
    shares = [connections // processes + (i < connections % processes) for i in range(processes)]
    req_shares = [n_requests * s // connections for s in shares]
    procs = [mp.get_context("spawn").Process(target=_process, args=(port, s, r, deadline, queue))
             for s, r in zip(shares, req_shares)]
    t0 = time.perf_counter()
    for p in procs:
        p.start()
    results = [queue.get(timeout=duration_s + 60) for _ in procs]
    wall = time.perf_counter() - t0
    for p in procs:
        p.join()
    latencies = sorted(x for lat, _ in results for x in lat)
    errors = [e for _, errs in results for e in errs]
    if not latencies:
        raise RuntimeError(f"no request completed: {errors[:3]}")
    # Process start-up is inside `wall`, which understates the rate slightly: the figure errs on the safe side.
    return {
        "connections": connections, "client_processes": processes, "requests": len(latencies),
        "wall_s": wall, "requests_per_s": len(latencies) / wall,
        "latency_ms": {"p50": 1000 * latencies[len(latencies) // 2],
                       "p99": 1000 * latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))],
                       "max": 1000 * latencies[-1], "mean": 1000 * statistics.fmean(latencies)},
        "errors": errors[:5], "cpu_count": os.cpu_count(), "load_avg_1m": os.getloadavg()[0],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--connections", type=int, default=8)
    ap.add_argument("--processes", type=int, default=2, help="client processes the connections are spread over")
    ap.add_argument("--requests", type=int, default=20000, help="stop after this many requests in all")
    ap.add_argument("--duration", type=float, default=30.0, help="stop after this many seconds at most")
    ap.add_argument("--json", help="also write the result to this file")
    args = ap.parse_args()

    server = subprocess.Popen([sys.executable, "-m", "harness.cli", "serve-reward", "--host", "127.0.0.1",
                               "--port", "0"], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        line = server.stdout.readline()  # "reward server: serving ... at http://127.0.0.1:PORT (...)"
        try:
            url = line.split(" at ", 1)[1].split()[0]
            port = int(url.rsplit(":", 1)[1])
            wait_healthy(url, 30)
        except Exception as e:
            print(f"reward server did not start: {line!r} ({e})", file=sys.stderr)
            return 2
        result = run(args.connections, args.processes, args.requests, args.duration, port)
    finally:
        server.terminate()
        server.wait(timeout=10)
    result["target"] = {"requests_per_s": TARGET_RPS, "p99_ms": TARGET_P99_MS}
    result["met"] = result["requests_per_s"] >= TARGET_RPS and result["latency_ms"]["p99"] < TARGET_P99_MS
    print(json.dumps(result, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    if result["errors"]:
        return 2
    return 0 if result["met"] else 1


if __name__ == "__main__":
    sys.exit(main())
