#!/usr/bin/env python3
"""rspamd's side of a delivery, replayed: what the pod asks rspamd, without the pod.

record PORT DIR N
    An HTTP server on 127.0.0.1:PORT that answers every POST /checkv2 as rspamd
    would for a clean message ("no action") and keeps the first N requests, the
    request headers and the message exactly as the pod sent them, in DIR
    (NNNN.json: headers; NNNN.eml: the message). Point a pod's
    filter.rspamd.url at it and send it mail.

scan HOST:PORT DIR CONCURRENCY SECONDS
    Sends DIR's requests to rspamd's /checkv2 in turn, over CONCURRENCY kept
    connections, each waiting for its answer before the next (closed loop, so
    rspamd is kept busy without a queue building up). Prints one JSON line:
    scans, errors, scans/s, latency percentiles, the actions, and how often
    each symbol was seen.

check HOST:PORT FILE [HEADER=VALUE ...]
    One scan of FILE: its action, score and symbols (one JSON line).
"""
import asyncio
import json
import os
import sys
import time
from collections import Counter

CLEAN = json.dumps({"action": "no action", "score": 0.0, "required_score": 15.0, "symbols": {}}).encode()


async def read_response(reader):
    """Status, headers (lower-case names) and body of one HTTP/1.1 response."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            k, v = line.split(":", 1)
            headers[k.strip().lower()] = v.strip()
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return status, headers, body


async def read_request(reader):
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    method, path = lines[0].split()[:2]
    headers = []
    for line in lines[1:]:
        if ":" in line:
            k, v = line.split(":", 1)
            headers.append((k.strip(), v.strip()))
    length = next((int(v) for k, v in headers if k.lower() == "content-length"), 0)
    return method, path, headers, await reader.readexactly(length)


def record(port, out, n):
    os.makedirs(out, exist_ok=True)
    kept = [0]

    async def serve(reader, writer):
        try:
            while True:
                method, path, headers, body = await read_request(reader)
                if method == "POST" and path.endswith("/checkv2") and kept[0] < n:
                    i = kept[0]
                    kept[0] += 1
                    keep = [(k, v) for k, v in headers if k.lower() not in ("host", "content-length", "password")]
                    with open(f"{out}/{i:04d}.json", "w") as f:
                        json.dump(keep, f)
                    with open(f"{out}/{i:04d}.eml", "wb") as f:
                        f.write(body)
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(CLEAN), CLEAN))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    async def main():
        server = await asyncio.start_server(serve, "127.0.0.1", port)
        async with server:
            await server.serve_forever()

    asyncio.run(main())


def request_bytes(authority, headers, body):
    head = f"POST /checkv2 HTTP/1.1\r\nHost: {authority}\r\nContent-Length: {len(body)}\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in headers)
    return head.encode() + b"\r\n" + body


def load(directory, authority):
    reqs = []
    for name in sorted(os.listdir(directory)):
        if name.endswith(".eml"):
            stem = os.path.join(directory, name[:-4])
            headers = json.load(open(stem + ".json")) if os.path.exists(stem + ".json") else []
            reqs.append(request_bytes(authority, headers, open(stem + ".eml", "rb").read()))
    if not reqs:
        sys.exit(f"no .eml files in {directory}")
    return reqs


def scan(target, directory, concurrency, seconds):
    host, port = target.rsplit(":", 1)
    reqs = load(directory, target)
    latencies, actions, symbols = [], Counter(), Counter()
    errors = [0]
    deadline = time.monotonic() + seconds

    async def worker(k):
        reader = writer = None
        i = k
        while time.monotonic() < deadline:
            if writer is None:
                reader, writer = await asyncio.open_connection(host, int(port))
            t0 = time.monotonic()
            writer.write(reqs[i % len(reqs)])
            i += concurrency
            try:
                status, headers, body = await read_response(reader)
            except (asyncio.IncompleteReadError, ConnectionError):
                errors[0] += 1
                writer.close()
                writer = None
                continue
            latencies.append(time.monotonic() - t0)
            if status != 200:
                errors[0] += 1
            else:
                answer = json.loads(body)
                actions[answer.get("action", "?")] += 1
                symbols.update(answer.get("symbols", {}).keys())
            if headers.get("connection", "").lower() == "close":
                writer.close()
                writer = None
        if writer is not None:
            writer.close()

    async def main():
        t0 = time.monotonic()
        await asyncio.gather(*(worker(k) for k in range(concurrency)))
        return time.monotonic() - t0

    wall = asyncio.run(main())
    latencies.sort()

    def pct(p):
        return round(latencies[min(len(latencies) - 1, int(p * len(latencies)))] * 1000, 2) if latencies else None

    print(json.dumps({
        "scans": len(latencies), "errors": errors[0], "seconds": round(wall, 1),
        "scans_per_s": round(len(latencies) / wall, 1), "p50_ms": pct(0.50), "p95_ms": pct(0.95), "p99_ms": pct(0.99),
        "actions": dict(actions), "symbols": dict(symbols.most_common()),
    }))


def check(target, path, extra):
    host, port = target.rsplit(":", 1)
    headers = [tuple(h.split("=", 1)) for h in extra]

    async def main():
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(request_bytes(target, headers, open(path, "rb").read()))
        _, _, body = await read_response(reader)
        writer.close()
        return json.loads(body)

    answer = asyncio.run(main())
    print(json.dumps({"action": answer.get("action"), "score": answer.get("score"),
                      "symbols": sorted(answer.get("symbols", {}).keys())}))


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "record":
        record(int(args[0]), args[1], int(args[2]))
    elif cmd == "scan":
        scan(args[0], args[1], int(args[2]), float(args[3]))
    elif cmd == "check":
        check(args[0], args[1], args[2:])
    else:
        sys.exit(__doc__)
