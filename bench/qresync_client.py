"""A client back after changes elsewhere (bench/qresync.sh): how many bytes and
how long it takes to bring its copy of user0001's INBOX up to date, first with a
full `EXAMINE` + `UID FETCH 1:* (UID FLAGS)` (what a client without QRESYNC does),
then with `ENABLE QRESYNC` + `EXAMINE INBOX (QRESYNC (uidvalidity modseq))`
(RFC 7162 §3.2.5). Between the client's first look and the resynchronisations
another connection flags CHANGES random messages and expunges EXPUNGES others.
Both answers are checked: the full one lists exactly the messages left, the
QRESYNC one names every expunged UID in VANISHED (EARLIER) and every flagged one
in a FETCH. Bytes are what the server sent, counted on the socket.

Usage: qresync_client.py PORT JSON_OUT LABEL [CHANGES EXPUNGES RUNS]"""

import json
import os
import random
import re
import socket
import statistics
import sys
import time

port, out, label = int(sys.argv[1]), sys.argv[2], sys.argv[3]
changes = int(sys.argv[4]) if len(sys.argv) > 4 else 1000
expunges = int(sys.argv[5]) if len(sys.argv) > 5 else 100
runs = int(sys.argv[6]) if len(sys.argv) > 6 else 5
USER = os.environ.get("QRESYNC_USER", "user0001@example.test")


class Conn:
    def __init__(self):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=600)
        self.file = self.sock.makefile("rb", buffering=1 << 20)
        self.tag = 0
        self.received = 0
        self.line()

    def line(self):
        line = self.file.readline()
        assert line, "connection closed"
        self.received += len(line)
        return line

    def cmd(self, text):
        """Sends one command; returns all response lines (literals inlined)."""
        self.tag += 1
        tag = f"q{self.tag}".encode()
        self.sock.sendall(tag + b" " + text.encode() + b"\r\n")
        lines = []
        while True:
            line = self.line()
            m = re.search(rb"\{(\d+)\}\r\n$", line)
            if m:
                data = self.file.read(int(m.group(1)))
                self.received += len(data)
                line += data + self.line()
            lines.append(line)
            if line.startswith(tag + b" "):
                assert line.startswith(tag + b" OK"), line
                return lines

    def pipeline(self, commands):
        """Sends all commands at once, then reads every answer (each must be OK)."""
        payload = b""
        for text in commands:
            self.tag += 1
            payload += f"q{self.tag} {text}\r\n".encode()
        self.sock.sendall(payload)
        last = f"q{self.tag} ".encode()
        while True:
            line = self.line()
            if line.startswith(b"q"):
                assert line.split(b" ", 2)[1] == b"OK", line
                if line.startswith(last):
                    return


def login():
    c = Conn()
    c.cmd(f"LOGIN {USER} pass")
    return c


def number(lines, pattern):
    for line in lines:
        m = re.search(pattern, line)
        if m:
            return int(m.group(1))
    raise AssertionError(f"{pattern!r} not in the answer")


def uid_flags(lines):
    """UID -> flags of `* n FETCH (UID u FLAGS (...))` lines (either order)."""
    out = {}
    for line in lines:
        if b" FETCH (" not in line:
            continue
        uid = int(re.search(rb"UID (\d+)", line).group(1))
        out[uid] = re.search(rb"FLAGS \(([^)]*)\)", line).group(1)
    return out


def uid_set(text):
    uids = set()
    for part in text.split(b","):
        lo, _, hi = part.partition(b":")
        uids.update(range(int(lo), int(hi or lo) + 1))
    return uids


# The client's first look: UIDVALIDITY, HIGHESTMODSEQ and every UID.
a = login()
a.cmd("ENABLE QRESYNC")
sel = a.cmd("EXAMINE INBOX")
validity = number(sel, rb"\[UIDVALIDITY (\d+)\]")
modseq = number(sel, rb"\[HIGHESTMODSEQ (\d+)\]")
uids = sorted(uid_flags(a.cmd("UID FETCH 1:* (UID FLAGS)")))
a.cmd("LOGOUT")
print(f"{label}: {len(uids)} messages, UIDVALIDITY {validity}, HIGHESTMODSEQ {modseq}", flush=True)

# Changes made elsewhere meanwhile.
rng = random.Random(7162)
picked = rng.sample(uids, changes + expunges)
flagged, gone = sorted(picked[:changes]), sorted(picked[changes:])
b = login()
b.cmd("SELECT INBOX")
b.pipeline([f"UID STORE {u} +FLAGS.SILENT (\\Flagged)" for u in flagged])
b.cmd("UID STORE " + ",".join(map(str, gone)) + " +FLAGS.SILENT (\\Deleted)")
b.cmd("UID EXPUNGE " + ",".join(map(str, gone)))
b.cmd("LOGOUT")

results = {}
for kind in ("full", "qresync"):
    times, sizes = [], []
    for _ in range(runs):
        c = login()
        if kind == "qresync":
            c.cmd("ENABLE QRESYNC")
        start_bytes, t0 = c.received, time.perf_counter()
        if kind == "full":
            lines = c.cmd("EXAMINE INBOX") + c.cmd("UID FETCH 1:* (UID FLAGS)")
        else:
            lines = c.cmd(f"EXAMINE INBOX (QRESYNC ({validity} {modseq}))")
        times.append((time.perf_counter() - t0) * 1000)
        sizes.append(c.received - start_bytes)
        c.cmd("LOGOUT")
        seen = uid_flags(lines)
        if kind == "full":
            assert set(seen) == set(uids) - set(gone), "the full answer lists the messages left"
        else:
            vanished = set()
            for line in lines:
                if line.startswith(b"* VANISHED (EARLIER) "):
                    vanished |= uid_set(line.split(b" ", 3)[3].strip())
            assert set(gone) <= vanished and not (vanished & (set(uids) - set(gone))), "VANISHED names the expunged"
            assert set(flagged) <= set(seen) and all(b"\\Flagged" in seen[u] for u in flagged), "every change fetched"
    results[kind] = {"bytes": statistics.median(sizes), "ms_median": statistics.median(times),
                     "ms_min": min(times), "ms_max": max(times), "runs": runs}
    print(f"{label} {kind:8} bytes {results[kind]['bytes']:>10,.0f}  ms median {results[kind]['ms_median']:8.1f}"
          f"  (min {min(times):.1f}, max {max(times):.1f})", flush=True)
ratio = results["full"]["bytes"] / results["qresync"]["bytes"]
print(f"{label}: QRESYNC sends {ratio:.1f}x fewer bytes, "
      f"{results['full']['ms_median'] / results['qresync']['ms_median']:.1f}x faster", flush=True)
results.update({"label": label, "messages": len(uids), "changes": changes, "expunges": expunges, "bytes_ratio": ratio})
json.dump(results, open(out, "w"), indent=1)
