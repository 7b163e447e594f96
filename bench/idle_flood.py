#!/usr/bin/env python3
"""Many concurrent sessions held open on one server, as mail clients hold them:

  smtp: connect, greeting, NOOP; held; NOOP again, QUIT
  imap: connect, greeting, LOGIN, IDLE (RFC 2177); held; DONE, LOGOUT

    idle_flood.py smtp|imap HOST PORT --conns N --ramp SECS --hold SECS [--tls]
                  [--users-template 'u{:03}@domain' --users-count K --password P]

Connections start evenly over the ramp. Prints one JSON object: sessions opened and
failed (by reason), and the P50/P99/max of the time to the greeting (the TCP
connect and the server's first line) and of the login (IMAP) or first NOOP (SMTP),
(with --tls, the TLS handshake too) in milliseconds; then how many sessions were
still alive at the end of the hold. Bounded by ramp + hold + a 30 s timeout.
"""

import argparse
import asyncio
import json
import ssl
import time

TIMEOUT = 30.0


def pct(values, p):
    if not values:
        return None
    values = sorted(values)
    return round(values[min(len(values) - 1, int(p / 100 * len(values)))], 2)


async def read_line(reader):
    line = await asyncio.wait_for(reader.readline(), TIMEOUT)
    if not line:
        raise ConnectionError("closed")
    return line


async def until_tagged(reader, tag):
    while True:
        line = await read_line(reader)
        if line.startswith(tag + b" "):
            if not line.startswith(tag + b" OK"):
                raise RuntimeError("imap-" + line.split()[1].decode(errors="replace").lower())
            return


async def session(args, i, start, hold_until, stats):
    await asyncio.sleep(max(0.0, start + args.ramp * i / max(1, args.conns) - time.monotonic()))
    t0 = time.monotonic()
    writer = None
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(args.host, args.port, ssl=args.tls_context), TIMEOUT)
        greeting = await read_line(reader)
        stats["greeting"].append((time.monotonic() - t0) * 1000)
        t1 = time.monotonic()
        if args.protocol == "smtp":
            if not greeting.startswith(b"220"):
                raise RuntimeError("smtp-greeting-" + greeting[:3].decode(errors="replace"))
            writer.write(b"NOOP\r\n")
            if not (await read_line(reader)).startswith(b"250"):
                raise RuntimeError("smtp-noop")
        else:
            user = args.users_template.format(i % args.users_count + 1)
            writer.write(f'a LOGIN "{user}" "{args.password}"\r\n'.encode())
            await until_tagged(reader, b"a")
            writer.write(b"b IDLE\r\n")
            while not (await read_line(reader)).startswith(b"+"):
                pass
        stats["session"].append((time.monotonic() - t1) * 1000)
        stats["open"] += 1
        await asyncio.sleep(max(0.0, hold_until - time.monotonic()))
        # Still there after the hold: one more round trip proves it.
        if args.protocol == "smtp":
            writer.write(b"NOOP\r\n")
            if not (await read_line(reader)).startswith(b"250"):
                raise RuntimeError("smtp-noop-after-hold")
            writer.write(b"QUIT\r\n")
        else:
            writer.write(b"DONE\r\n")
            await until_tagged(reader, b"b")
            writer.write(b"c LOGOUT\r\n")
        stats["alive_after_hold"] += 1
    except Exception as e:  # every failure is counted by kind, none stops the run
        kind = type(e).__name__ if not isinstance(e, RuntimeError) else str(e)
        stats["errors"][kind] = stats["errors"].get(kind, 0) + 1
    finally:
        if writer is not None:
            writer.close()


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("protocol", choices=["smtp", "imap"])
    ap.add_argument("host")
    ap.add_argument("port", type=int)
    ap.add_argument("--conns", type=int, default=10000)
    ap.add_argument("--ramp", type=float, default=2.0)
    ap.add_argument("--hold", type=float, default=10.0)
    ap.add_argument("--users-template", default="user{:03}@bench.test")
    ap.add_argument("--users-count", type=int, default=20)
    ap.add_argument("--password", default="bench-secret")
    ap.add_argument("--tls", action="store_true", help="implicit TLS (IMAPS, SMTPS); the certificate is not checked")
    args = ap.parse_args()
    args.tls_context = None
    if args.tls:
        args.tls_context = ssl.create_default_context()
        args.tls_context.check_hostname = False
        args.tls_context.verify_mode = ssl.CERT_NONE
    stats = {"greeting": [], "session": [], "open": 0, "alive_after_hold": 0, "errors": {}}
    start = time.monotonic()
    hold_until = start + args.ramp + args.hold
    await asyncio.gather(*(session(args, i, start, hold_until, stats) for i in range(args.conns)))
    print(json.dumps({
        "protocol": args.protocol,
        "conns": args.conns,
        "opened": stats["open"],
        "alive_after_hold": stats["alive_after_hold"],
        "errors": stats["errors"],
        "greeting_ms": {"p50": pct(stats["greeting"], 50), "p99": pct(stats["greeting"], 99),
                        "max": pct(stats["greeting"], 100)},
        ("login_ms" if args.protocol == "imap" else "noop_ms"): {
            "p50": pct(stats["session"], 50), "p99": pct(stats["session"], 99), "max": pct(stats["session"], 100)},
    }))


if __name__ == "__main__":
    asyncio.run(main())
