"""Python poplib against the server: STLS on the plain port, then implicit TLS.
argv: pop3s_port pop3_port. The maildrop holds two messages ("first", "second").
Exits non-zero (assertion) on any mismatch."""
import poplib
import ssl
import sys

pop3s_port, pop3_port = int(sys.argv[1]), int(sys.argv[2])
USER, PASSWORD = "bob@example.org", "pw"
ctx = ssl.create_default_context()
ctx.check_hostname = False
ctx.verify_mode = ssl.CERT_NONE

# STLS: plaintext login is not offered before TLS, is after.
p = poplib.POP3("127.0.0.1", pop3_port, timeout=20)
caps = p.capa()
assert "STLS" in caps and "USER" not in caps, caps
p.stls(context=ctx)
caps = p.capa()
assert "USER" in caps and "UIDL" in caps and "TOP" in caps and "STLS" not in caps, caps
p.user(USER)
p.pass_(PASSWORD)
count, octets = p.stat()
assert count == 2, (count, octets)
_, listing, _ = p.list()
sizes = [int(line.split()[1]) for line in listing]
assert len(sizes) == 2 and sum(sizes) == octets, (listing, octets)
_, uidls, _ = p.uidl()
uids = [line.split()[1] for line in uidls]
assert len(set(uids)) == 2, uidls
assert p.uidl(2).split()[2] == uids[1]
_, lines, size = p.retr(1)
assert b"Subject: first" in lines and b"first body" in lines, lines
# RETR's octet count is the message with CRLF line ends, as LIST said.
assert sum(len(l) + 2 for l in lines) == sizes[0], (size, sizes[0])
_, top, _ = p.top(2, 0)
assert b"Subject: second" in top and b"second body" not in top, top
p.dele(1)
assert p.stat()[0] == 1
p.rset()
assert p.stat()[0] == 2
p.dele(1)
resp = p.quit()
assert resp.startswith(b"+OK"), resp

# Implicit TLS: the deletion was applied; unique ids are stable across sessions.
p = poplib.POP3_SSL("127.0.0.1", pop3s_port, context=ctx, timeout=20)
p.user(USER)
p.pass_(PASSWORD)
assert p.stat()[0] == 1
_, uidls, _ = p.uidl()
assert [line.split()[1] for line in uidls] == [uids[1]], (uidls, uids)
_, lines, _ = p.retr(1)
assert b"second body" in lines, lines
try:
    p.retr(2)
    raise AssertionError("RETR of a missing message succeeded")
except poplib.error_proto as e:
    assert str(e).startswith("b'-ERR"), e
p.quit()

# Wrong password: an [AUTH] response code (RFC 3206).
p = poplib.POP3_SSL("127.0.0.1", pop3s_port, context=ctx, timeout=20)
p.user(USER)
try:
    p.pass_("wrong")
    raise AssertionError("wrong password accepted")
except poplib.error_proto as e:
    assert "[AUTH]" in str(e), e
p.quit()
print("poplib session ok")
