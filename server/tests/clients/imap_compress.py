"""COMPRESS=DEFLATE (RFC 4978) from a client written with Python's zlib: raw
DEFLATE both ways over implicit TLS, a sync flush after every command, as mail
clients do. Usage: imap_compress.py IMAPS_PORT"""

import socket
import ssl
import sys
import zlib

port = int(sys.argv[1])
ctx = ssl.create_default_context()
ctx.check_hostname = False
ctx.verify_mode = ssl.CERT_NONE
sock = ctx.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=20))
plain = sock.makefile("rb")


def until(tag, read_line):
    lines = []
    while True:
        line = read_line()
        assert line, f"connection closed waiting for {tag!r}: {lines}"
        lines.append(line)
        if line.startswith(tag + b" "):
            return lines


def plain_cmd(tag, text):
    sock.sendall(tag + b" " + text + b"\r\n")
    return until(tag, plain.readline)


assert plain.readline().startswith(b"* OK")
r = plain_cmd(b"z", b"COMPRESS DEFLATE")
assert r[-1].startswith(b"z BAD"), r  # not before login
r = plain_cmd(b"a", b"LOGIN bob@example.org pw")
assert r[-1].startswith(b"a OK"), r
r = plain_cmd(b"b", b"CAPABILITY")
assert b"COMPRESS=DEFLATE" in r[0], r
r = plain_cmd(b"u", b"COMPRESS LZW")
assert r[-1].startswith(b"u NO"), r
r = plain_cmd(b"c", b"COMPRESS DEFLATE")
assert r == [b"c OK DEFLATE active\r\n"], r

deflate = zlib.compressobj(6, zlib.DEFLATED, -15)
inflate = zlib.decompressobj(-15)
pending = b""
wire_in = 0


def read_line():
    global pending, wire_in
    while b"\n" not in pending:
        data = sock.recv(65536)
        assert data, "connection closed"
        wire_in += len(data)
        pending += inflate.decompress(data)
    line, _, pending = pending.partition(b"\n")
    return line + b"\n"


def cmd(tag, text):
    sock.sendall(deflate.compress(tag + b" " + text + b"\r\n") + deflate.flush(zlib.Z_SYNC_FLUSH))
    return until(tag, read_line)


r = cmd(b"d", b"SELECT INBOX")
assert b"* 2 EXISTS\r\n" in r and r[-1].startswith(b"d OK"), r
r = cmd(b"e", b"FETCH 1:* (BODY.PEEK[])")
text = b"".join(r)
assert b"first body" in text and b"second body" in text and r[-1].startswith(b"e OK"), r
r = cmd(b"f", b"COMPRESS DEFLATE")
assert r[-1].startswith(b"f NO [COMPRESSIONACTIVE]"), r
r = cmd(b"g", b"CAPABILITY")
assert b"COMPRESS=DEFLATE" not in r[0], r
# A command far larger than one read: literal data through the inflater.
body = b"Subject: big\r\n\r\n" + b"x" * 200_000 + b"\r\n"
sock.sendall(deflate.compress(b"h APPEND INBOX {%d+}\r\n" % len(body) + body + b"\r\n")
             + deflate.flush(zlib.Z_SYNC_FLUSH))
r = until(b"h", read_line)
assert r[-1].startswith(b"h OK"), r
r = cmd(b"i", b"LOGOUT")
assert r[0].startswith(b"* BYE"), r
print(f"compressed session ok; {wire_in} bytes received on the wire")
