# A typical account's filter, as mail clients' filter editors write them:
# lists into a folder, a flag for a colleague's domain, newsletters by the
# address's detail, a spam score threshold. Load mail matches none of the
# filing rules, so it stays in INBOX where the load's IMAP and POP3 read it;
# every test still runs on every message.
require ["fileinto", "mailbox", "imap4flags", "envelope", "subaddress", "spamtest", "relational", "comparator-i;ascii-numeric"];
if exists "List-Id" { fileinto :create "Lists"; stop; }
if header :contains "Subject" ["[announce]", "newsletter"] { fileinto :create "News"; stop; }
if envelope :detail "to" "news" { fileinto :create "News"; stop; }
if spamtest :value "ge" :comparator "i;ascii-numeric" "8" { fileinto "Junk"; stop; }
if address :domain :is "from" "partner.example" { addflag "$Work"; }
keep;
