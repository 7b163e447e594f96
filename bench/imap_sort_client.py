"""SORT latency from concurrent IMAP sessions (bench/imap-sort.sh): each session
logs in as its own user, selects INBOX, then alternates `UID SORT (DATE) UTF-8 ALL`
and `UID SORT (SUBJECT) UTF-8 ALL` for a fixed time. Prints one line per sort key
(count, commands/s, P50/P95/P99 in ms) and writes them as JSON.

With RATE 0 (the default) each session sends its next sort as soon as the last one
is answered (closed loop: the latency is mostly queueing behind the other 49).
With RATE r > 0 each session sorts r times a second on a fixed schedule, the
sessions' schedules spread over the first interval, and a sort's latency counts
from its scheduled time, so a server that falls behind is charged for the wait.

Usage: imap_sort_client.py PORT USERS SECONDS JSON_OUT [LABEL] [RATE]"""

import asyncio
import json
import sys
import time

port, users, seconds, out = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
label = sys.argv[5] if len(sys.argv) > 5 else str(port)
rate = float(sys.argv[6]) if len(sys.argv) > 6 else 0.0
KEYS = ("DATE", "SUBJECT")


async def session(n, stop_at, latencies, counts, errors, warm):
    reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 24)
    await reader.readline()
    tags = iter(range(1, 1 << 30))

    async def cmd(text):
        tag = f"t{next(tags)}".encode()
        writer.write(tag + b" " + text.encode() + b"\r\n")
        await writer.drain()
        numbers = 0
        while True:
            line = await reader.readline()
            if not line:
                raise EOFError("connection closed")
            if line.startswith(b"* SORT"):
                numbers = len(line.split()) - 2
            if line.startswith(tag + b" "):
                return line, numbers

    line, _ = await cmd(f"LOGIN user{n:04d} pass")
    assert b" OK" in line, line
    line, _ = await cmd("SELECT INBOX")
    assert b" OK" in line, line
    if warm:
        for key in KEYS:
            await cmd(f"UID SORT ({key}) UTF-8 ALL")
    interval = 1 / rate if rate > 0 else 0.0
    due = time.perf_counter() + interval * (n % users) / users
    while time.monotonic() < stop_at:
        for key in KEYS:
            if interval:
                await asyncio.sleep(max(0.0, due - time.perf_counter()))
                t = due
                due += interval
            else:
                t = time.perf_counter()
            line, numbers = await cmd(f"UID SORT ({key}) UTF-8 ALL")
            latencies[key].append(time.perf_counter() - t)
            if b" OK" not in line or numbers == 0:
                errors.append(line.decode(errors="replace").strip())
            counts[key] = max(counts[key], numbers)
    await cmd("LOGOUT")
    writer.close()


def pct(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(p / 100 * len(values)))] * 1000


async def main():
    # A warm-up pass first: each side builds what it caches for sorting.
    warm = {k: [] for k in KEYS}
    await asyncio.gather(*(session(n, 0, warm, {k: 0 for k in KEYS}, [], True) for n in range(1, users + 1)))
    latencies, counts, errors = {k: [] for k in KEYS}, {k: 0 for k in KEYS}, []
    stop_at = time.monotonic() + seconds
    await asyncio.gather(*(session(n, stop_at, latencies, counts, errors, False) for n in range(1, users + 1)))
    result = {}
    for key in KEYS:
        v = latencies[key]
        result[key] = {
            "count": len(v),
            "per_second": len(v) / seconds,
            "messages": counts[key],
            "p50_ms": pct(v, 50),
            "p95_ms": pct(v, 95),
            "p99_ms": pct(v, 99),
        }
        result[key]["rate_per_session"] = rate
        print(f"{label:<12} SORT ({key:<7}) {users} sessions{f' at {rate:g}/s each' if rate else ''}: {len(v):>6} sorts of {counts[key]} messages, "
              f"{len(v) / seconds:7.1f}/s  p50 {result[key]['p50_ms']:7.2f}  p95 {result[key]['p95_ms']:7.2f}  "
              f"p99 {result[key]['p99_ms']:7.2f} ms")
    result["errors"] = errors[:20]
    result["error_count"] = len(errors)
    json.dump(result, open(out, "w"), indent=1)
    if errors:
        print(f"{label}: {len(errors)} errors, e.g. {errors[0]}")


asyncio.run(main())
