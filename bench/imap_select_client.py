"""SELECT latency of sessions that open a large mailbox (bench/imap-select.sh):
C concurrent sessions, closed loop, each one connect, `LOGIN`, `SELECT INBOX`,
`LOGOUT`, cycling over USERS users (each session starts at its own user), for a
fixed time: what a mail client does when it opens a folder, on a server whose
every session may land on another pod. Prints one line (sessions/s, SELECT
P50/P95/P99 in ms, the EXISTS counts answered, errors) and writes it as JSON.

Usage: imap_select_client.py PORT USERS SECONDS JSON_OUT LABEL [C]"""

import asyncio
import json
import sys
import time

port, users, seconds, out, label = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), sys.argv[4], sys.argv[5]
concurrency = int(sys.argv[6]) if len(sys.argv) > 6 else 8


async def one_session(user, latencies, exists):
    reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 20)
    try:
        await reader.readline()
        tags = iter(range(1, 1 << 30))

        async def cmd(text):
            tag = f"t{next(tags)}".encode()
            writer.write(tag + b" " + text.encode() + b"\r\n")
            await writer.drain()
            lines = []
            while True:
                line = await reader.readline()
                if not line:
                    raise EOFError("connection closed")
                lines.append(line)
                if line.startswith(tag + b" "):
                    if b" OK" not in line:
                        raise RuntimeError(f"{text}: {line!r}")
                    return lines

        await cmd(f"LOGIN user{user:04d} pass")
        t = time.perf_counter()
        lines = await cmd("SELECT INBOX")
        latencies.append(time.perf_counter() - t)
        for line in lines:
            if line.endswith(b" EXISTS\r\n"):
                exists.add(int(line.split()[1]))
        await cmd("LOGOUT")
    finally:
        writer.close()


async def worker(n, stop_at, latencies, exists, errors):
    user = n % users + 1
    while time.monotonic() < stop_at:
        try:
            await one_session(user, latencies, exists)
        except Exception as e:  # counted, and the session goes on with the next user
            errors.append(str(e))
        user = user % users + 1


def pct(sorted_ms, p):
    return sorted_ms[min(len(sorted_ms) - 1, int(len(sorted_ms) * p))] if sorted_ms else 0.0


async def main():
    latencies, exists, errors = [], set(), []
    start = time.monotonic()
    await asyncio.gather(*(worker(n, start + seconds, latencies, exists, errors) for n in range(concurrency)))
    elapsed = time.monotonic() - start
    ms = sorted(x * 1000 for x in latencies)
    rate = len(ms) / elapsed
    print(
        f"{label:<18} sessions={len(ms)} sessions/s={rate:.1f} select P50={pct(ms, 0.5):.2f} "
        f"P95={pct(ms, 0.95):.2f} P99={pct(ms, 0.99):.2f} ms exists={sorted(exists)} errors={len(errors)}"
        + (f" first error: {errors[0]}" if errors else "")
    )
    report = {
        "label": label,
        "operations": {
            "imap-select": {
                "count": len(ms),
                "errors": len(errors),
                "throughput": rate,
                "latency_ms": {"p50": pct(ms, 0.5), "p95": pct(ms, 0.95), "p99": pct(ms, 0.99)},
            }
        },
    }
    with open(out, "w") as f:
        json.dump(report, f)


asyncio.run(main())
