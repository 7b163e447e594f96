"""CONDSTORE and QRESYNC (RFC 7162) as Python's imaplib speaks them: ENABLE,
FETCH MODSEQ and CHANGEDSINCE, STORE UNCHANGEDSINCE with its MODIFIED code, and a
second connection resynchronising with SELECT (QRESYNC ...) after the first one
changed flags and expunged. Usage: imaplib_condstore.py IMAPS_PORT"""

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


def modseq_of(data):
    return int(re.search(rb"MODSEQ \((\d+)\)", data).group(1))


a = connect()
assert "CONDSTORE" in a.capabilities and "QRESYNC" in a.capabilities, a.capabilities
typ, _ = a.enable("QRESYNC")
enabled = a.response("ENABLED")[1]
assert typ == "OK" and enabled == [b"QRESYNC"], (typ, enabled)
typ, _ = a.select("INBOX")
assert typ == "OK"
validity = int(a.untagged_responses["UIDVALIDITY"][0])
highest = int(a.untagged_responses["HIGHESTMODSEQ"][0])
typ, data = a.uid("FETCH", "1:*", "(UID FLAGS MODSEQ)")
assert typ == "OK" and len(data) == 2, data
uids = [int(re.search(rb"UID (\d+)", d).group(1)) for d in data]
assert all(modseq_of(d) <= highest for d in data), (data, highest)

# A conditional STORE that holds, then one against a stale modseq.
typ, data = a.uid("STORE", str(uids[0]), f"(UNCHANGEDSINCE {highest})", "+FLAGS", r"(\Flagged)")
assert typ == "OK", (typ, data)
changed = modseq_of(data[0])
assert changed > highest, data
typ, data = a.uid("STORE", str(uids[0]), f"(UNCHANGEDSINCE {highest})", "+FLAGS", r"(\Answered)")
assert typ == "OK", (typ, data)
typ, modified = a.response("MODIFIED")
assert modified == [str(uids[0]).encode()], modified
typ, data = a.uid("FETCH", "1:*", "(FLAGS)", f"(CHANGEDSINCE {highest})")
assert typ == "OK" and len(data) == 1 and rb"\Flagged" in data[0] and rb"\Answered" not in data[0], data

# The second message goes; the QRESYNC session hears VANISHED.
a.uid("STORE", str(uids[1]), "+FLAGS.SILENT", r"(\Deleted)")
typ, _ = a.expunge()
assert typ == "OK"
typ, vanished = a.response("VANISHED")
assert vanished == [str(uids[1]).encode()], vanished
a.logout()

# A client back later resynchronises in one SELECT.
b = connect()
b.enable("QRESYNC")
typ, data = b._simple_command("SELECT", "INBOX", f"(QRESYNC ({validity} {highest}))")
assert typ == "OK", (typ, data)
typ, vanished = b.response("VANISHED")
assert vanished == [f"(EARLIER) {uids[1]}".encode()], vanished
typ, fetched = b.response("FETCH")
assert len(fetched) == 1 and rb"\Flagged" in fetched[0] and f"MODSEQ ({changed})".encode() in fetched[0], fetched
b.logout()
print("imaplib CONDSTORE/QRESYNC session ok")
