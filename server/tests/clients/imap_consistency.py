#!/usr/bin/env python3
"""Many IMAP sessions on one mailbox at once, each checking what the server
tells it against what the others did: the kind of checking a mail client's
cache depends on (RFC 3501 §5.2 and §7.4.1, RFC 4315, RFC 9051 §7.5.1).

Every client keeps the session's view of the mailbox (sequence number → UID)
from the untagged responses alone, and runs random commands: NOOP, FETCH of
UIDs and flags, UID FETCH of a header, UID STORE, APPEND (each message carries
a token of its own), EXPUNGE, UID MOVE, UID SEARCH and IDLE. It fails on:
- an EXPUNGE or FETCH for a sequence number the view does not have, an EXISTS
  that shrinks the view, a FETCH whose UID differs from the one the view has
  for that number, UIDs not ascending with the sequence numbers;
- a keyword in FETCH FLAGS before a FLAGS response announced it;
- a FETCH after UID STORE +FLAGS without the flag (no client removes \\Seen or
  \\Deleted), an APPEND without APPENDUID, a UID given twice;
- a message whose header is not the one APPENDed under that UID;
- a UID SEARCH that returns a UID the session had been sent EXPUNGE for;
- at the end, after every session has caught up: views that differ from the
  mailbox, flags that differ between sessions, a message APPENDed that no one
  marked \\Deleted nor moved that is gone, a moved message whose COPYUID
  names another message;
- a client that took a snapshot mid-run (UIDVALIDITY, HIGHESTMODSEQ, every
  UID's flags) and resyncs at the end with SELECT (QRESYNC …) not ending up
  with the mailbox as it is (RFC 7162 §3.2.5).

Usage: imap_consistency.py SECONDS SEED USER PASSWORD PORT [PORT ...] [smtp=PORT ...] [pop3=PORT ...]
(clients are spread over the IMAP ports in turn: several pods of one cluster;
MAILCLUSTER_CONSISTENCY_CLIENTS of them, default 6). Each smtp=PORT gets a
sender delivering to USER meanwhile; every message it was answered 250 for must
end up in the INBOX or the folder messages were moved to, exactly once, unless
a session deleted it. Each pop3=PORT gets a POP3 client that reads and deletes
some of the mailbox meanwhile: one unique-id per message for ever, and what
its QUIT deleted gone from the INBOX.
"""

import os
import random
import poplib
import re
import smtplib
import socket
import sys
import threading
import time

CLIENTS = int(os.environ.get("MAILCLUSTER_CONSISTENCY_CLIENTS", "6"))
LOCK = threading.Lock()
# uid -> token of every message whose APPEND returned APPENDUID
TOKENS = {}
# uids some session set \Deleted on (only those and the moved may disappear)
DELETED_MARKED = set()
# uid in INBOX -> uid in MOVED_TO, of every UID MOVE that answered COPYUID
MOVED = {}
MOVED_TO = "Moved"
# tokens of the messages some session set \Deleted on, looked up just before
DELETED_TOKENS = set()
# uid in MOVED_TO -> token, looked up just before the MOVE
MOVED_TOKENS = {}
# tokens of the messages an SMTP server answered 250 for
SMTP_ACKED = set()
# POP3 unique-id -> token and back; tokens a POP3 QUIT deleted
UIDLS = {}
TOKEN_UIDLS = {}
POP3_DELETED = set()
# (client, UIDVALIDITY, HIGHESTMODSEQ, {uid: flags}) an offline client resyncs from
SNAPSHOTS = []

FAILURES = []
COUNTS = {}


class Failure(Exception):
    pass


def fail(who, text):
    raise Failure(f"client {who}: {text}")


def count(name):
    with LOCK:
        COUNTS[name] = COUNTS.get(name, 0) + 1


def tokenize(data):
    """The FETCH data list as nested Python lists of bytes (NIL as None)."""
    pos = 0

    def value():
        nonlocal pos
        while data[pos:pos + 1] == b" ":
            pos += 1
        c = data[pos:pos + 1]
        if c == b"(":
            pos += 1
            items = []
            while True:
                while data[pos:pos + 1] == b" ":
                    pos += 1
                if data[pos:pos + 1] == b")":
                    pos += 1
                    return items
                items.append(value())
        if c == b'"':
            pos += 1
            out = bytearray()
            while data[pos:pos + 1] != b'"':
                if data[pos:pos + 1] == b"\\":
                    pos += 1
                out += data[pos:pos + 1]
                pos += 1
            pos += 1
            return bytes(out)
        if c == b"{":
            end = data.index(b"}", pos)
            n = int(data[pos + 1:end].rstrip(b"+"))
            start = end + 3  # "}\r\n"
            pos = start + n
            return data[start:start + n]
        start = pos
        depth = 0
        while pos < len(data):
            ch = data[pos:pos + 1]
            if ch == b"[":
                depth += 1
            elif ch == b"]":
                depth -= 1
            elif depth == 0 and ch in b" ()":
                break
            pos += 1
        atom = data[start:pos]
        return None if atom.upper() == b"NIL" else atom

    return value()


def parse_uid_set(text):
    uids = set()
    for part in text.split(b","):
        lo, _, hi = part.partition(b":")
        lo, hi = int(lo), int(hi or lo)
        uids.update(range(min(lo, hi), max(lo, hi) + 1))
    return uids


def response_code(untagged, name):
    """The value of an untagged OK's response code, e.g. [HIGHESTMODSEQ 7]."""
    for u in untagged:
        if u[0] == "other":
            m = re.match(rb"OK \[" + name.encode() + rb" (\d+)\]", u[1])
            if m:
                return int(m.group(1))
    return None


class Session:
    def __init__(self, who, port, user, password, rng, select=True):
        self.who = who
        self.rng = rng
        self.login = (port, user, password)
        self.snapshots = 0
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.buf = b""
        self.tagn = 0
        self.view = []  # seq-1 -> uid or None
        self.flags = {}  # uid -> set of flags (as last reported)
        self.told_gone = set()  # uids this session was sent EXPUNGE for
        self.defined = set()  # the last FLAGS response
        self.readline()  # greeting
        self.command(f"LOGIN {user} {password}")
        if not select:
            return
        if who == 0:
            self.command(f"CREATE {MOVED_TO}")  # NO [ALREADYEXISTS] is fine
        self.command("SELECT INBOX")

    # -- wire --
    def readline(self):
        while b"\r\n" not in self.buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                fail(self.who, "connection closed")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def read_exact(self, n):
        while len(self.buf) < n:
            chunk = self.sock.recv(65536)
            if not chunk:
                fail(self.who, "connection closed in a literal")
            self.buf += chunk
        data, self.buf = self.buf[:n], self.buf[n:]
        return data

    def response(self):
        """One whole response line, literals inlined as {n}\\r\\n<bytes>."""
        line = self.readline()
        out = line
        while True:
            m = re.search(rb"\{(\d+)\+?\}$", line)
            if not m:
                return out
            lit = self.read_exact(int(m.group(1)))
            line = self.readline()
            out += b"\r\n" + lit + line

    def command(self, text, literal=None):
        self.tagn += 1
        tag = f"c{self.tagn}"
        if literal is not None:
            self.sock.sendall(f"{tag} {text} {{{len(literal)}}}\r\n".encode())
            cont = self.response()
            if not cont.startswith(b"+"):
                fail(self.who, f"{text}: no continuation: {cont!r}")
            self.sock.sendall(literal + b"\r\n")
        else:
            self.sock.sendall(f"{tag} {text}\r\n".encode())
        untagged = []
        while True:
            r = self.response()
            if r.startswith(tag.encode() + b" "):
                status = r[len(tag) + 1:]
                if not (status.startswith(b"OK") or status.startswith(b"NO")):
                    fail(self.who, f"{text}: {status!r}")
                return status, untagged
            if r.startswith(b"* "):
                untagged.append(self.untagged(r[2:], text))

    # -- the view --
    def untagged(self, r, during):
        if r.startswith(b"FLAGS "):
            self.defined = {f.decode() for f in tokenize(r[6:])}
            return ("flags", self.defined)
        m = re.match(rb"(\d+) (EXISTS|EXPUNGE|FETCH|RECENT)\b ?(.*)", r, re.S)
        if not m:
            return ("other", r)
        n, kind = int(m.group(1)), m.group(2)
        if kind == b"EXISTS":
            if n < len(self.view):
                fail(self.who, f"EXISTS {n} below the view's {len(self.view)} during {during}")
            self.view.extend([None] * (n - len(self.view)))
            return ("exists", n)
        if kind == b"EXPUNGE":
            if not 1 <= n <= len(self.view):
                fail(self.who, f"EXPUNGE {n} outside 1..{len(self.view)} during {during}")
            uid = self.view.pop(n - 1)
            if uid is not None:
                self.told_gone.add(uid)
            return ("expunge", uid)
        if kind == b"FETCH":
            if not 1 <= n <= len(self.view):
                fail(self.who, f"FETCH {n} outside 1..{len(self.view)} during {during}: {r!r}")
            items = tokenize(m.group(3))
            data = {}
            for i in range(0, len(items) - 1, 2):
                key = items[i].upper()
                data[key] = items[i + 1]
            uid = self.view[n - 1]
            if b"UID" in data:
                uid = int(data[b"UID"])
                known = self.view[n - 1]
                if known is not None and known != uid:
                    fail(self.who, f"sequence {n} was UID {known}, now FETCH says {uid} during {during}")
                self.view[n - 1] = uid
                self.check_ascending(during)
            # an unsolicited FETCH of another session's flag change may carry
            # no UID: the view names the message
            if uid is not None:
                if b"FLAGS" in data:
                    flags = {f.decode() for f in data[b"FLAGS"]}
                    flags.discard("\\Recent")
                    undefined = flags - self.defined
                    if undefined:
                        # a keyword must be announced in FLAGS before it is
                        # used (RFC 3501 §7.2.6), as imaptest checks
                        fail(self.who, f"FETCH uses {undefined} not in FLAGS {self.defined} during {during}")
                    self.flags[uid] = flags
            return ("fetch", n, data)
        return ("recent", n)

    def check_ascending(self, during):
        last = 0
        for seq, uid in enumerate(self.view, 1):
            if uid is None:
                continue
            if uid <= last:
                fail(self.who, f"UIDs not ascending at sequence {seq} ({uid} after {last}) during {during}")
            last = uid

    def known(self):
        return [u for u in self.view if u is not None]

    # -- operations --
    def op_noop(self):
        self.command("NOOP")

    def op_fetch_all(self):
        if not self.view:
            return
        before = len(self.view)
        status, untagged = self.command("FETCH 1:* (UID FLAGS)")
        got = {u[1] for u in untagged if u[0] == "fetch"}
        # no EXPUNGE may arrive during FETCH (RFC 3501 §7.4.1)
        if any(u[0] == "expunge" for u in untagged):
            fail(self.who, "EXPUNGE during FETCH")
        if status.startswith(b"NO"):
            # a message of the view expunged meanwhile (RFC 2180 §4.1.2, RFC 5530 EXPUNGEISSUED)
            count("fetch-no")
            return
        missing = [s for s in range(1, before + 1) if s not in got]
        if missing:
            fail(self.who, f"FETCH 1:* left out sequence numbers {missing[:5]}")

    def tokens(self, uids):
        """{uid: X-Token} of those of `uids` the server still has."""
        found = {}
        for i in range(0, len(uids), 50):
            chunk = ",".join(map(str, uids[i:i + 50]))
            _, untagged = self.command(f"UID FETCH {chunk} (UID BODY.PEEK[HEADER.FIELDS (X-Token)])")
            for u in untagged:
                if u[0] == "fetch" and b"UID" in u[2]:
                    body = next((v for k, v in u[2].items() if k.startswith(b"BODY[")), None)
                    m = re.search(rb"X-Token: (\S+)", body or b"")
                    if m:
                        found[int(u[2][b"UID"])] = m.group(1).decode()
        return found

    def token_of(self, uid):
        return self.tokens([uid]).get(uid)

    def op_fetch_header(self):
        uids = self.known()
        if not uids:
            return
        pick = self.rng.sample(uids, min(3, len(uids)))
        _, untagged = self.command(
            f"UID FETCH {','.join(map(str, pick))} (UID BODY.PEEK[HEADER.FIELDS (X-Token)])")
        for u in untagged:
            if u[0] != "fetch":
                continue
            data = u[2]
            body = next((v for k, v in data.items() if k.startswith(b"BODY[")), None)
            if body is None or b"UID" not in data:
                continue
            uid = int(data[b"UID"])
            with LOCK:
                want = TOKENS.get(uid)
            token = re.search(rb"X-Token: (\S+)", body or b"")
            if want is not None and (token is None or token.group(1).decode() != want):
                fail(self.who, f"UID {uid} has header {body!r}, APPENDed with token {want}")

    def op_store(self):
        uids = self.known()
        if not uids:
            return
        uid = self.rng.choice(uids)
        flag = self.rng.choice(["\\Seen", "\\Deleted", "$Work", "\\Flagged"])
        sign = "-" if flag in ("$Work", "\\Flagged") and self.rng.random() < 0.5 else "+"
        if flag == "\\Deleted" and sign == "+":
            # another session's EXPUNGE may remove it before this one hears
            # of the flag: what it was is known from here on
            token = self.token_of(uid)
            with LOCK:
                DELETED_MARKED.add(uid)
                if token:
                    DELETED_TOKENS.add(token)
        _, untagged = self.command(f"UID STORE {uid} {sign}FLAGS ({flag})")
        for u in untagged:
            if u[0] == "fetch" and b"UID" in u[2] and int(u[2][b"UID"]) == uid and b"FLAGS" in u[2]:
                flags = {f.decode() for f in u[2][b"FLAGS"]}
                if sign == "+" and flag in ("\\Seen", "\\Deleted") and flag not in flags:
                    fail(self.who, f"UID STORE {uid} +FLAGS {flag} answered FLAGS {flags}")
        if flag == "\\Deleted" and sign == "+":
            count("deleted")

    def op_append(self):
        token = f"{self.who}-{os.urandom(6).hex()}"  # unique across runs too
        body = (f"From: c{self.who}@example.org\r\nSubject: {token}\r\nX-Token: {token}\r\n\r\n"
                f"{'text ' * self.rng.randint(1, 200)}\r\n").encode()
        status, _ = self.command("APPEND INBOX", literal=body)
        m = re.search(rb"\[APPENDUID (\d+) (\d+)\]", status)
        if not m:
            fail(self.who, f"APPEND without APPENDUID: {status!r}")
        uid = int(m.group(2))
        with LOCK:
            if uid in TOKENS:
                fail(self.who, f"APPENDUID {uid} given twice")
            TOKENS[uid] = token
        count("append")

    def op_expunge(self):
        self.command("EXPUNGE")
        count("expunge")

    def op_move(self):
        uids = self.known()
        if not uids:
            return
        uid = self.rng.choice(uids)
        token = self.token_of(uid)
        status, untagged = self.command(f"UID MOVE {uid} {MOVED_TO}")
        # COPYUID comes in an untagged OK, before the EXPUNGE (RFC 6851 §4.3)
        # or, less usefully, in the tagged one
        texts = [u[1] for u in untagged if u[0] == "other"] + [status]
        m = next(filter(None, (re.search(rb"\[COPYUID \d+ (\d+) (\d+)\]", t) for t in texts)), None)
        if status.startswith(b"OK"):
            # a MOVE of a message expunged meanwhile moves nothing
            if m:
                if int(m.group(1)) != uid:
                    fail(self.who, f"UID MOVE {uid} answered {status!r}")
                with LOCK:
                    if uid in MOVED:
                        fail(self.who, f"UID {uid} moved twice: {status!r}")
                    MOVED[uid] = int(m.group(2))
                    if token:
                        MOVED_TOKENS[int(m.group(2))] = token
                count("move")

    def op_snapshot(self):
        """What an offline client keeps: UIDVALIDITY, HIGHESTMODSEQ and the
        flags of every UID, from a connection of its own (RFC 7162 §3.1)."""
        if self.snapshots >= 2:
            return
        self.snapshots += 1
        s = Session(self.who, *self.login, self.rng, select=False)
        _, untagged = s.command("SELECT INBOX (CONDSTORE)")
        uv, modseq = response_code(untagged, "UIDVALIDITY"), response_code(untagged, "HIGHESTMODSEQ")
        if uv is None or modseq is None:
            fail(self.who, f"SELECT (CONDSTORE) without UIDVALIDITY or HIGHESTMODSEQ: {untagged}")
        s.command("UID FETCH 1:* (UID FLAGS)")
        cache = {uid: s.flags[uid] for uid in s.view if uid is not None}
        s.command("LOGOUT")
        s.sock.close()
        with LOCK:
            SNAPSHOTS.append((self.who, uv, modseq, cache))
        count("snapshot")

    def op_idle(self):
        self.tagn += 1
        tag = f"c{self.tagn}".encode()
        self.sock.sendall(tag + b" IDLE\r\n")
        while True:
            r = self.response()
            if r.startswith(b"+"):
                break
            if r.startswith(tag + b" "):
                fail(self.who, f"IDLE refused: {r!r}")
            self.untagged(r[2:], "IDLE")
        # what the others do meanwhile arrives as untagged responses
        time.sleep(self.rng.uniform(0.02, 0.3))
        self.sock.sendall(b"DONE\r\n")
        while True:
            r = self.response()
            if r.startswith(tag + b" "):
                if not r[len(tag) + 1:].startswith(b"OK"):
                    fail(self.who, f"IDLE ended with {r!r}")
                return
            self.untagged(r[2:], "IDLE")

    def op_search(self):
        told_before = set(self.told_gone)
        _, untagged = self.command("UID SEARCH ALL")
        for u in untagged:
            if u[0] == "other" and u[1].startswith(b"SEARCH"):
                found = [int(x) for x in u[1].split()[1:]]
                if found != sorted(found):
                    fail(self.who, "UID SEARCH result not ascending")
                # a session may still hold a message another one expunged
                # until it is told (RFC 2180 §4.1): only UIDs it was told of
                # before the command are stale
                stale = [x for x in found if x in told_before]
                if stale:
                    fail(self.who, f"UID SEARCH returned expunged UIDs {stale[:5]}")

    def step(self):
        op = self.rng.choices(
            [self.op_noop, self.op_fetch_all, self.op_fetch_header, self.op_store, self.op_append,
             self.op_expunge, self.op_search, self.op_idle, self.op_move, self.op_snapshot],
            weights=[3, 3, 3, 6, 3, 2, 2, 1, 1, 1])[0]
        op()
        count("commands")

    def settle(self):
        """The session's view after catching up: UID SEARCH ALL, FETCH of all."""
        self.command("NOOP")
        self.op_fetch_all()
        _, untagged = self.command("UID SEARCH ALL")
        found = next([int(x) for x in u[1].split()[1:]] for u in untagged
                     if u[0] == "other" and u[1].startswith(b"SEARCH"))
        return found


def resync(who, port, login, uv, modseq, cache, truth):
    """A client back online (RFC 7162 §3.2.5): SELECT with QRESYNC from its
    snapshot, then VANISHED (EARLIER) and the FETCHes of what changed must
    turn the snapshot into the mailbox as it is."""
    s = Session(f"{who}-resync", port, *login, random.Random(0), select=False)
    s.command("ENABLE QRESYNC")
    _, untagged = s.command(f"SELECT INBOX (QRESYNC ({uv} {modseq}))")
    if response_code(untagged, "UIDVALIDITY") != uv:
        print(f"client {who}: UIDVALIDITY changed: {untagged}")
        sys.exit(1)
    cache = dict(cache)
    changed = 0
    for u in untagged:
        if u[0] == "other" and u[1].startswith(b"VANISHED (EARLIER) "):
            for uid in parse_uid_set(u[1][len(b"VANISHED (EARLIER) "):].strip()):
                cache.pop(uid, None)
        elif u[0] == "fetch" and b"UID" in u[2] and b"FLAGS" in u[2]:
            uid = int(u[2][b"UID"])
            cache[uid] = s.flags[uid]
            changed += 1
    s.command("LOGOUT")
    if cache != truth:
        extra = sorted(set(cache) - set(truth))
        missing = sorted(set(truth) - set(cache))
        wrong = sorted(u for u in set(cache) & set(truth) if cache[u] != truth[u])
        print(f"client {who}: QRESYNC from HIGHESTMODSEQ {modseq} left UIDs {extra[:10]} that are gone, "
              f"missed UIDs {missing[:10]}, and has other flags on {[(u, cache[u], truth[u]) for u in wrong[:5]]}")
        sys.exit(1)
    count("resync")


def smtp_sender(port, recipient, seconds):
    """Inbound mail for the mailbox while the sessions work on it, one
    connection kept open, a few dozen messages a second."""
    deadline = time.monotonic() + seconds
    run = os.urandom(4).hex()  # another run's messages may still be there
    n = 0
    conn = None
    while time.monotonic() < deadline:
        n += 1
        token = f"smtp{port}-{run}-{n}"
        msg = (f"From: sender@remote.test\r\nTo: {recipient}\r\nSubject: {token}\r\n"
               f"X-Token: {token}\r\n\r\ninbound {n}\r\n")
        try:
            if conn is None:
                conn = smtplib.SMTP("127.0.0.1", port, timeout=30)
            conn.sendmail("sender@remote.test", [recipient], msg)
        except (smtplib.SMTPException, OSError) as e:
            # not acknowledged: it may or may not have been stored
            conn = None
            count("smtp-error")
            if isinstance(e, smtplib.SMTPResponseException) and e.smtp_code >= 500:
                with LOCK:
                    FAILURES.append(f"SMTP {port}: {e!r}")
                return
            continue
        with LOCK:
            SMTP_ACKED.add(token)
        time.sleep(0.03)
    if conn is not None:
        conn.quit()


def pop3_client(port, login, seconds, seed):
    """A POP3 client on the same mailbox (a phone on IMAP, a desktop on POP3):
    UIDL, RETR of a few, DELE of some, QUIT. A unique-id names one message for
    ever (RFC 1939 §7); what QUIT deleted is gone from the INBOX."""
    rng = random.Random(seed * 1000 + port)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(rng.uniform(0.05, 0.2))
        try:
            p = poplib.POP3("127.0.0.1", port, timeout=30)
            p.user(login[0])
            try:
                p.pass_(login[1])
            except poplib.error_proto as e:
                if b"IN-USE" in e.args[0]:
                    count("pop3-in-use")  # another POP3 session has the maildrop
                    p.quit()
                    continue
                raise
            _, listing, _ = p.uidl()
            listing = [line.split() for line in listing]
            deleted = []
            for num, uidl in rng.sample(listing, min(3, len(listing))):
                try:
                    _, lines, _ = p.retr(int(num))
                except poplib.error_proto:
                    # an IMAP session expunged it after this one listed it:
                    # -ERR is the answer (RFC 1939 has no better one)
                    count("pop3-retr-gone")
                    continue
                token = next((ln.split()[1].decode() for ln in lines if ln.startswith(b"X-Token: ")), None)
                if token is None:
                    continue
                with LOCK:
                    if UIDLS.setdefault(uidl, token) != token or TOKEN_UIDLS.setdefault(token, uidl) != uidl:
                        FAILURES.append(f"POP3: unique-id {uidl!r} is {token}, was {UIDLS[uidl]} "
                                        f"(and {token} was {TOKEN_UIDLS[token]!r})")
                        return
                if rng.random() < 0.5:
                    p.dele(int(num))
                    deleted.append(token)
                    with LOCK:
                        DELETED_TOKENS.add(token)
            p.quit()
            with LOCK:
                POP3_DELETED.update(deleted)
            count("pop3")
        except (poplib.error_proto, OSError) as e:
            with LOCK:
                FAILURES.append(f"POP3: {e!r}")
            return


def client(who, port, args, seconds, seed):
    rng = random.Random(seed * 1000 + who)
    try:
        s = Session(who, port, args[0], args[1], rng)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            s.step()
        return s
    except Failure as e:
        with LOCK:
            FAILURES.append(str(e))
    except OSError as e:
        with LOCK:
            FAILURES.append(f"client {who}: {e!r}")
    return None


def main():
    seconds, seed = float(sys.argv[1]), int(sys.argv[2])
    user, password = sys.argv[3], sys.argv[4]
    ports = [int(p) for p in sys.argv[5:] if p.isdigit()]
    smtp_ports = [int(p[5:]) for p in sys.argv[5:] if p.startswith("smtp=")]
    pop3_ports = [int(p[5:]) for p in sys.argv[5:] if p.startswith("pop3=")]
    ports = [p for p in ports if p not in smtp_ports + pop3_ports]
    sessions = [None] * CLIENTS

    def run(i):
        sessions[i] = client(i, ports[i % len(ports)], (user, password), seconds, seed)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(CLIENTS)]
    threads += [threading.Thread(target=smtp_sender, args=(p, user, seconds)) for p in smtp_ports]
    threads += [threading.Thread(target=pop3_client, args=(p, (user, password), seconds, seed)) for p in pop3_ports]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if FAILURES:
        print("\n".join(FAILURES))
        sys.exit(1)

    # A queueing MTA in front of the store (the reference: Postfix, then LMTP)
    # answers 250 before the message is in the mailbox: give it time.
    time.sleep(float(os.environ.get("MAILCLUSTER_CONSISTENCY_SETTLE_SECS", "0")))
    # Every session catches up (another pod's changes reach a session within
    # the notification delay, so allow a few rounds), then all must agree.
    deadline = time.monotonic() + 10
    while True:
        try:
            views = [s.settle() for s in sessions]
            known = [s.view for s in sessions]
        except Failure as e:
            print(e)
            sys.exit(1)
        if all(v == views[0] for v in views) and all(k == views[0] for k in known):
            break
        if time.monotonic() > deadline:
            for i, (v, k) in enumerate(zip(views, known)):
                print(f"client {i}: UID SEARCH {v[:10]}… ({len(v)}), view {k[:10]}… ({len(k)})")
            print("sessions did not converge on one view of the mailbox")
            sys.exit(1)
        time.sleep(0.2)
    final = views[0]
    for uid in final:
        flags = [s.flags.get(uid) for s in sessions]
        if any(f != flags[0] for f in flags):
            print(f"UID {uid}: sessions disagree on its flags: {flags}")
            sys.exit(1)
    truth = {uid: sessions[0].flags[uid] for uid in final}
    for who, uv, modseq, cache in SNAPSHOTS:
        resync(who, ports[who % len(ports)], (user, password), uv, modseq, cache, truth)
    lost = sorted(uid for uid, token in TOKENS.items()
                  if uid not in final and uid not in DELETED_MARKED and uid not in MOVED
                  and token not in DELETED_TOKENS)
    if lost:
        print(f"APPENDed, never deleted nor moved, and gone: UIDs {lost[:10]}")
        sys.exit(1)
    # Every message by its token: APPENDed ones under their APPENDUID, moved
    # ones under their COPYUID, none twice, and no SMTP-accepted one missing
    # unless a session deleted it.
    s = sessions[0]
    inbox = s.tokens(final)
    for uid in final:
        if uid in TOKENS and inbox.get(uid) != TOKENS[uid]:
            print(f"UID {uid}: header token {inbox.get(uid)}, APPENDed as {TOKENS[uid]}")
            sys.exit(1)
    s.view, s.flags = [], {}
    s.command(f"EXAMINE {MOVED_TO}")
    s.command("UID FETCH 1:* (UID)")
    moved = s.tokens(s.known())
    for dst, token in MOVED_TOKENS.items():
        if moved.get(dst) != token:
            print(f"{MOVED_TO} UID {dst}: token {moved.get(dst)}, moved there as {token}")
            sys.exit(1)
    everywhere = list(inbox.values()) + list(moved.values())
    twice = sorted({t for t in everywhere if everywhere.count(t) > 1})
    if twice:
        print(f"stored twice: {twice[:10]}")
        sys.exit(1)
    back = sorted(POP3_DELETED & set(inbox.values()))
    if back:
        print(f"deleted by a POP3 QUIT and still in the INBOX: {back[:10]}")
        sys.exit(1)
    missing = sorted(SMTP_ACKED - set(everywhere) - DELETED_TOKENS)
    if missing:
        print(f"accepted over SMTP, never deleted, and not in INBOX or {MOVED_TO}: {missing[:10]}")
        sys.exit(1)
    print(f"ok: {CLIENTS} clients over {len(ports)} port(s), {seconds} s, seed {seed}: "
          f"{COUNTS.get('commands', 0)} commands, {COUNTS.get('append', 0)} APPENDs, "
          f"{COUNTS.get('expunge', 0)} EXPUNGEs, {COUNTS.get('move', 0)} MOVEs, "
          f"{COUNTS.get('resync', 0)} QRESYNCs, {len(SMTP_ACKED)} SMTP deliveries, "
          f"{COUNTS.get('pop3', 0)} POP3 sessions, {len(final)} messages at the end, "
          f"{len(set(TOKENS) - set(final))} expunged")


if __name__ == "__main__":
    main()
