-- Aliases: mail to `address` (at a local domain) goes to each of its targets,
-- accounts of this cluster. An address that is also an account's is the
-- account's: aliases are looked up only for addresses no account has.
CREATE TABLE aliases (
    domain_id INTEGER NOT NULL REFERENCES domains (id) ON DELETE CASCADE,
    address   TEXT NOT NULL,
    target    TEXT NOT NULL,
    PRIMARY KEY (address, target)
);
CREATE INDEX aliases_domain ON aliases (domain_id);
