"""UTF8=ACCEPT (RFC 9755) as Python's imaplib speaks it: enable() switches the
library to UTF-8 commands, names are sent quoted in UTF-8 and come back so in
LIST and STATUS, APPEND of a message with a UTF-8 header (imaplib wraps it in
UTF8 (...)), SEARCH without a charset, and a second connection that did not
enable it sees the same mailbox in modified UTF-7. Usage: imaplib_utf8.py
IMAPS_PORT"""

import imaplib
import re
import ssl
import sys

port = int(sys.argv[1])
ctx = ssl.create_default_context()
ctx.check_hostname = False
ctx.verify_mode = ssl.CERT_NONE


def connect():
    m = imaplib.IMAP4_SSL("127.0.0.1", port, ssl_context=ctx, timeout=20)
    m.login("bob@example.org", "pw")
    return m


m = connect()
assert "UTF8=ACCEPT" in m.capabilities, m.capabilities
typ, data = m.enable("UTF8=ACCEPT")
assert typ == "OK" and m.utf8_enabled, (typ, data)

name = "Entwürfe/Größe"
typ, data = m.create(f'"{name}"')
assert typ == "OK", (typ, data)
typ, data = m.list('""', '"Entw*"')
assert typ == "OK", (typ, data)
listed = [line.decode("utf-8") for line in data]
assert f'(\\HasNoChildren) "/" "{name}"' in listed, listed
assert '(\\HasChildren) "/" "Entwürfe"' in listed, listed

message = (
    "From: Jörg <jörg@example.org>\r\n"
    "To: bob@example.org\r\n"
    "Subject: Grüße aus Köln\r\n"
    "\r\n"
    "Hallo Bob\r\n"
).encode("utf-8")
typ, data = m.append(f'"{name}"', "(\\Seen)", None, message)
assert typ == "OK" and b"APPENDUID" in data[0], (typ, data)

typ, data = m.status(f'"{name}"', "(MESSAGES)")
assert typ == "OK" and data[0].decode("utf-8") == f'"{name}" (MESSAGES 1)', (typ, data)

typ, data = m.select(f'"{name}"')
assert typ == "OK" and data == [b"1"], (typ, data)
typ, data = m.search(None, "SUBJECT", '"köln"')
assert typ == "OK" and data == [b"1"], (typ, data)
typ, data = m.search(None, "FROM", '"jörg"')
assert typ == "OK" and data == [b"1"], (typ, data)
typ, data = m.fetch("1", "(RFC822.SIZE BODY.PEEK[])")
assert typ == "OK", (typ, data)
size = int(re.search(rb"RFC822\.SIZE (\d+)", data[0][0]).group(1))
# Stored as sent: the same octets, no wrapper.
assert data[0][1] == message and size == len(message), (size, data)

typ, data = m.rename(f'"{name}"', '"Entwürfe/Klein"')
assert typ == "OK", (typ, data)
m.logout()

# A client that did not enable UTF8=ACCEPT gets modified UTF-7 names.
m = connect()
typ, data = m.list('""', '"Entw*"')
listed = [line.decode("ascii") for line in data]
assert '(\\HasNoChildren) "/" "Entw&APw-rfe/Klein"' in listed, listed
typ, data = m.select('"Entw&APw-rfe/Klein"', readonly=True)
assert typ == "OK" and data == [b"1"], (typ, data)
m.logout()
print("imaplib UTF8=ACCEPT session ok")
