#!/usr/bin/env python3
"""Concurrent streaming clients on loopback: a load test and the benchmark driver.

    python3 load_test.py --url http://127.0.0.1:8080 --clients 32 --seconds 60 [--max-tokens 32]

Each client sends streaming chat requests back to back until the time is up and
checks every response: HTTP 200, SSE events each `data: <json>`, one
`chat.completion.chunk` id per response, a finish_reason, a usage chunk whose
completion_tokens matches the tokens seen, and `data: [DONE]` last. A 429 is
counted (and retried after Retry-After) but is not a failure; anything else is.
Prints a JSON summary: requests, failures, aggregate completion tokens/s, and
time-to-first-token percentiles. Works against any OpenAI-compatible server
(llama-server too), which is how benchmarks/serve.md compares them.
"""
import argparse
import http.client
import json
import statistics
import sys
import threading
import time
from urllib.parse import urlparse

PROMPTS = [
    "Write a short story about a lighthouse keeper.",
    "Explain how a bicycle works.",
    "List some facts about the moon.",
    "Describe a busy market in the morning.",
]

# A schema with long free strings, so constrained replies run as long as plain ones.
STORY_SCHEMA = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "maxLength": 60},
        "year": {"type": "integer", "minimum": 1900, "maximum": 2100},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 5},
        "body": {"type": "string"},
    },
    "required": ["title", "year", "tags", "body"],
}


def one_request(host, port, i, args):
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
        "max_tokens": args.max_tokens,
        "temperature": 0.8,
        "seed": i,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if args.ignore_eos:
        body["ignore_eos"] = True
    if args.json_schema:
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "story", "schema": STORY_SCHEMA}}
    t0 = time.perf_counter()
    conn = http.client.HTTPConnection(host, port, timeout=600)
    headers = {"Content-Type": "application/json"}
    if args.api_key:
        headers["Authorization"] = f"Bearer {args.api_key}"
    conn.request("POST", "/v1/chat/completions", json.dumps(body), headers)
    resp = conn.getresponse()
    if resp.status == 429:
        wait = float(resp.getheader("Retry-After", "1"))
        resp.read()
        conn.close()
        return {"busy": True, "wait": wait}
    if resp.status != 200:
        raise AssertionError(f"status {resp.status}: {resp.read()[:300]!r}")
    ttft = None
    ids, finish, usage, n_content, done = set(), None, None, 0, False
    buf = b""
    while True:
        line = resp.readline()
        if not line:
            break
        if line in (b"\n", b"\r\n"):
            continue
        assert line.startswith(b"data: "), line
        assert not done, "an event after [DONE]"
        data = line[6:].strip()
        if data == b"[DONE]":
            done = True
            continue
        ev = json.loads(data)
        assert "error" not in ev, ev
        assert ev["object"] == "chat.completion.chunk", ev
        ids.add(ev["id"])
        if ev.get("usage"):
            usage = ev["usage"]
            continue
        ch = ev["choices"][0]
        if ch["delta"].get("content"):
            if ttft is None:
                ttft = time.perf_counter() - t0
            n_content += 1
        finish = ch.get("finish_reason") or finish
    conn.close()
    assert done, "no data: [DONE]"
    assert len(ids) == 1, ids
    assert finish in ("stop", "length"), finish
    assert usage and usage["completion_tokens"] >= n_content, (usage, n_content)
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"], usage
    return {"tokens": usage["completion_tokens"], "ttft": ttft if ttft is not None else time.perf_counter() - t0, "busy": False}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--requests", type=int, default=0, help="stop each client after this many (0: time only)")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--ignore-eos", action="store_true")
    ap.add_argument("--json-schema", action="store_true", help="constrain every reply to a JSON Schema (the mask's cost)")
    ap.add_argument("--api-key", default=None)
    args = ap.parse_args()
    u = urlparse(args.url)
    host, port = u.hostname, u.port or 80
    results, failures, busy = [], [], [0]
    lock = threading.Lock()
    deadline = time.perf_counter() + args.seconds
    counter = [0]

    def client():
        done_here = 0
        while time.perf_counter() < deadline and (args.requests == 0 or done_here < args.requests):
            with lock:
                i = counter[0]
                counter[0] += 1
            try:
                r = one_request(host, port, i, args)
            except Exception as e:  # noqa: BLE001 - every failure is reported
                with lock:
                    failures.append(f"{type(e).__name__}: {e}")
                continue
            if r["busy"]:
                with lock:
                    busy[0] += 1
                time.sleep(r["wait"])
                continue
            done_here += 1
            with lock:
                results.append(r)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(args.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    ttfts = sorted(r["ttft"] for r in results)
    tokens = sum(r["tokens"] for r in results)
    q = lambda p: ttfts[min(len(ttfts) - 1, int(p * len(ttfts)))] if ttfts else None  # noqa: E731
    summary = {
        "clients": args.clients,
        "requests": len(results),
        "failures": len(failures),
        "busy_429": busy[0],
        "wall_s": round(wall, 2),
        "completion_tokens": tokens,
        "tokens_per_s": round(tokens / wall, 2),
        "ttft_median_s": round(statistics.median(ttfts), 3) if ttfts else None,
        "ttft_p90_s": round(q(0.9), 3) if ttfts else None,
        "first_failures": failures[:5],
    }
    print(json.dumps(summary))
    sys.exit(1 if failures or not results else 0)


if __name__ == "__main__":
    main()
