"""Python imaplib against the server: implicit TLS, STARTTLS, and IDLE on a raw
socket. argv: imaps_port imap_port. Exits non-zero (assertion) on any mismatch."""
import imaplib
import re
import socket
import ssl
import sys
import time

imaps_port, imap_port = int(sys.argv[1]), int(sys.argv[2])
USER, PASSWORD = "bob@example.org", "pw"
ctx = ssl.create_default_context()
ctx.check_hostname = False
ctx.verify_mode = ssl.CERT_NONE
imaplib.Commands.setdefault("MOVE", ("SELECTED",))

# STARTTLS: login is refused before TLS, works after.
m = imaplib.IMAP4("127.0.0.1", imap_port)
assert "LOGINDISABLED" in m.capabilities, m.capabilities
assert "STARTTLS" in m.capabilities, m.capabilities
m.starttls(ssl_context=ctx)
assert "AUTH=PLAIN" in m.capabilities, m.capabilities
typ, _ = m.login(USER, PASSWORD)
assert typ == "OK"
m.logout()

m = imaplib.IMAP4_SSL("127.0.0.1", imaps_port, ssl_context=ctx)
typ, _ = m.login(USER, PASSWORD)
assert typ == "OK"
typ, data = m.list()
assert typ == "OK" and any(b'"INBOX"' in d for d in data), data
assert any(b"\\Sent" in d for d in data), data
typ, data = m.select("INBOX")
assert typ == "OK" and data == [b"2"], data
# OBJECTID (RFC 8474): SELECT's untagged OK carries the MAILBOXID code.
OBJECTID = rb"\(([A-Za-z0-9_-]{1,255})\)"
typ, data = m.response("MAILBOXID")
assert typ == "MAILBOXID" and data and re.fullmatch(OBJECTID, data[-1]), (typ, data)
typ, data = m.search(None, "UNSEEN")
assert data == [b"1 2"], data
typ, data = m.uid("SEARCH", "SUBJECT", "second")
assert data == [b"2"], data
typ, data = m.fetch("1", "(RFC822)")
assert typ == "OK" and b"first body" in data[0][1], data
typ, data = m.fetch("1", "(FLAGS)")
assert b"\\Seen" in data[0], data
typ, data = m.fetch("2", "(BODY.PEEK[HEADER.FIELDS (SUBJECT)] ENVELOPE BODYSTRUCTURE)")
assert typ == "OK" and b"Subject: second" in data[0][1], data
typ, data = m.store("2", "+FLAGS", "\\Flagged")
assert typ == "OK" and b"\\Flagged" in data[0], data
typ, data = m.fetch("1", "(EMAILID)")
email_id = re.fullmatch(rb"1 \(EMAILID " + OBJECTID + rb"\)", data[0])
assert typ == "OK" and email_id, data
typ, data = m.copy("1", "Archive")
assert typ == "OK", data
typ, data = m._simple_command("MOVE", "2", "Trash")
assert typ == "OK", data
# MOVE announced "* 2 EXPUNGE"; take it out of imaplib's pending responses.
typ, data = m._untagged_response(typ, data, "EXPUNGE")
assert data == [b"2"], data
typ, data = m.status("Trash", "(MESSAGES)")
assert data == [b'"Trash" (MESSAGES 1)'], data
typ, data = m.append("INBOX", "(\\Seen)", None, b"From: x@example.org\r\nSubject: appended\r\n\r\nappended body\r\n")
assert typ == "OK" and b"APPENDUID" in data[0], data
typ, data = m.noop()
typ, data = m.search(None, "ALL")
assert data == [b"1 2"], data
typ, data = m.store("1", "+FLAGS", "\\Deleted")
typ, data = m.expunge()
assert data == [b"1"], data
typ, data = m.fetch("1", "(BODY[TEXT])")
assert b"appended body" in data[0][1], data

# Non-ASCII search strings as clients send them: in a literal (imaplib's
# `literal`), and as UTF-8 in a quoted string (bytes arguments; RFC 3501 wants
# 7-bit there, but clients do it and servers take it). Matching ignores case.
greeting = "From: x@example.org\r\nSubject: =?UTF-8?Q?Gr=C3=BC=C3=9Fe?=\r\n" \
    "Content-Type: text/plain; charset=utf-8\r\n\r\nSch\u00f6ne Gr\u00fc\u00dfe\r\n"
typ, data = m.append("Archive", None, None, greeting.encode())
assert typ == "OK", data
typ, data = m.select("Archive")
assert data == [b"2"], data
# The copy keeps the EMAILID, and SEARCH finds it by it.
typ, data = m.fetch("1", "(EMAILID THREADID)")
assert data == [b"1 (EMAILID (" + email_id.group(1) + b") THREADID NIL)"], data
typ, data = m.search(None, "EMAILID", email_id.group(1))
assert data == [b"1"], data
m.literal = "gr\u00fc\u00dfe".encode()
typ, data = m.search("UTF-8", "SUBJECT")
assert (typ, data) == ("OK", [b"2"]), (typ, data)
typ, data = m.uid("SEARCH", "CHARSET", "UTF-8", "BODY", '"SCH\u00d6NE"'.encode())
assert (typ, data) == ("OK", [b"2"]), (typ, data)
typ, data = m.search(None, "CHARSET", "UTF-8", "TEXT", '"sch\u00f6ne gr\u00fc\u00dfe"'.encode())
assert (typ, data) == ("OK", [b"2"]), (typ, data)
typ, data = m.search(None, "CHARSET", "UTF-8", "SUBJECT", '"gr\u00fcn"'.encode())
assert (typ, data) == ("OK", [b""]), (typ, data)
typ, data = m.check()
assert (typ, data) == ("OK", [b"CHECK completed"]), (typ, data)
m.logout()

# IDLE on a raw TLS socket: another connection appends, the idler hears EXISTS.
raw = ctx.wrap_socket(socket.create_connection(("127.0.0.1", imaps_port)))
f = raw.makefile("rwb")


def send(line):
    f.write(line.encode() + b"\r\n")
    f.flush()


def until(tag):
    while True:
        line = f.readline()
        assert line, "connection closed"
        if line.startswith(tag.encode() + b" "):
            return line


f.readline()
send(f"a LOGIN {USER} {PASSWORD}")
assert until("a").startswith(b"a OK")
send("b SELECT INBOX")
assert until("b").startswith(b"b OK")
send("c IDLE")
assert f.readline().startswith(b"+ "), "no continuation"
other = imaplib.IMAP4_SSL("127.0.0.1", imaps_port, ssl_context=ctx)
other.login(USER, PASSWORD)
started = time.monotonic()
other.append("INBOX", None, None, b"Subject: wake\r\n\r\nup\r\n")
line = f.readline()
waited = time.monotonic() - started
assert line == b"* 2 EXISTS\r\n", line
assert waited < 1.0, waited
send("DONE")
assert until("c").startswith(b"c OK"), "IDLE not terminated"
send("d LOGOUT")
until("d")
other.logout()
print("imaplib: all checks passed; IDLE woke after %.1f ms" % (waited * 1000))
