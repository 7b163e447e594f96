"""Python imaplib and poplib fetch large messages, over TLS and plain TCP.
argv: imaps_port imap_port pop3s_port pop3_port message_file...
The maildrop holds the messages of the files, in order. IMAP must return each
byte for byte (whole, partial, TEXT); POP3's RETR each line as stored, with
bare LF line ends read as CRLF and dot-stuffing undone by poplib.
Exits non-zero (assertion) on any mismatch."""
import imaplib
import poplib
import re
import ssl
import sys

imaps, imap, pop3s, pop3 = (int(p) for p in sys.argv[1:5])
messages = [open(path, "rb").read() for path in sys.argv[5:]]
USER, PASSWORD = "bob@example.org", "pw"
ctx = ssl.create_default_context()
ctx.check_hostname = False
ctx.verify_mode = ssl.CERT_NONE


def literal(data):
    """The literal of a one-message FETCH response."""
    assert data and isinstance(data[0], tuple), data
    return data[0][1]


for session in (imaplib.IMAP4_SSL("127.0.0.1", imaps, ssl_context=ctx, timeout=30),
                imaplib.IMAP4("127.0.0.1", imap, timeout=30)):
    if isinstance(session, imaplib.IMAP4_SSL):
        session.login(USER, PASSWORD)
    else:
        session.starttls(ssl_context=ctx)
        session.login(USER, PASSWORD)
    typ, _ = session.select("INBOX", readonly=True)
    assert typ == "OK"
    for n, raw in enumerate(messages, start=1):
        typ, data = session.fetch(str(n), "(BODY.PEEK[])")
        assert typ == "OK" and literal(data) == raw, (n, len(literal(data)), len(raw))
        typ, data = session.fetch(str(n), "(BODY.PEEK[]<100.50000>)")
        assert typ == "OK" and literal(data) == raw[100:50100], n
        header_end = raw.index(b"\r\n\r\n") + 4
        typ, data = session.fetch(str(n), "(BODY.PEEK[TEXT])")
        assert typ == "OK" and literal(data) == raw[header_end:], n
    # Several large messages in one response, the second right after the first.
    typ, data = session.fetch("1:%d" % len(messages), "(BODY.PEEK[])")
    got = [part[1] for part in data if isinstance(part, tuple)]
    assert typ == "OK" and got == messages, [len(g) for g in got]
    session.logout()


def stored_lines(raw):
    lines = re.split(rb"\r?\n", raw)
    if raw.endswith(b"\n"):
        lines.pop()
    return lines


for p in (poplib.POP3_SSL("127.0.0.1", pop3s, context=ctx, timeout=30),
          poplib.POP3("127.0.0.1", pop3, timeout=30)):
    if not isinstance(p, poplib.POP3_SSL):
        p.stls(context=ctx)
    p.user(USER)
    p.pass_(PASSWORD)
    _, listing, _ = p.list()
    for n, raw in enumerate(messages, start=1):
        _, lines, _ = p.retr(n)
        assert lines == stored_lines(raw), (n, len(lines), len(stored_lines(raw)))
        if raw.endswith(b"\r\n") and b"\n" not in raw.replace(b"\r\n", b""):
            # As SMTP stores mail: LIST's size is what RETR sends, unstuffed.
            size = int(listing[n - 1].split()[1])
            assert sum(len(line) + 2 for line in lines) == size, (n, size)
    p.rset()
    p.quit()
print("large bodies: ok")
