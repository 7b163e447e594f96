-- A SHA-256 of each script's source, written with it: pods read which
-- accounts have an active script, and its digest, every few seconds, and
-- fetch a source only when its digest is one they have not compiled.
ALTER TABLE sieve_scripts ADD COLUMN digest BLOB NOT NULL DEFAULT x'';
