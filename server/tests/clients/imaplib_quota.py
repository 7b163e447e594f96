"""QUOTA (RFC 9208) as Python's imaplib speaks it: getquotaroot and getquota, the
refused setquota, and an APPEND refused with OVERQUOTA once the account is full.
The account's limit (octets) is set by the caller. Usage: imaplib_quota.py
IMAPS_PORT LIMIT"""

import imaplib
import re
import ssl
import sys

port, limit = int(sys.argv[1]), int(sys.argv[2])
ctx = ssl.create_default_context()
ctx.check_hostname = False
ctx.verify_mode = ssl.CERT_NONE

m = imaplib.IMAP4_SSL("127.0.0.1", port, ssl_context=ctx, timeout=20)
m.login("bob@example.org", "pw")
assert "QUOTA" in m.capabilities and "QUOTA=RES-STORAGE" in m.capabilities, m.capabilities

typ, data = m.getquotaroot("INBOX")
assert typ == "OK", (typ, data)
roots, quotas = data
assert roots == [b'"INBOX" ""'], roots
used, cap = map(int, re.search(rb"\(STORAGE (\d+) (\d+)\)", quotas[0]).groups())
assert cap == limit // 1024, (cap, limit)

typ, data = m.getquota('""')
assert typ == "OK" and re.search(rb"STORAGE \d+ %d" % cap, data[0]), (typ, data)

# imaplib returns a NO (it raises only for BAD).
typ, data = m.setquota('""', "(STORAGE 999999)")
assert typ == "NO" and b"[NOPERM]" in data[0], (typ, data)

typ, data = m.status("INBOX", "(SIZE)")
size = int(re.search(rb"SIZE (\d+)", data[0]).group(1))
room = limit - size
fits = b"Subject: fits\r\n\r\n" + b"x" * (room - 17)
assert len(fits) == room
typ, data = m.append("INBOX", None, None, fits)
assert typ == "OK" and b"APPENDUID" in data[0], (typ, data)
typ, data = m.append("INBOX", None, None, b"Subject: one too many\r\n\r\nx")
assert typ == "NO" and b"[OVERQUOTA]" in data[0], (typ, data)
typ, data = m.getquotaroot("INBOX")
assert re.search(rb"\(STORAGE %d %d\)" % (cap, cap), data[1][0]), data
m.logout()
print("imaplib quota session ok")
