-- The header block's length beside the body, so FETCH of BODY[], BODY[HEADER],
-- BODY[TEXT] and HEADER.FIELDS reads the body row alone instead of decoding the
-- metadata document. Nullable: pods of the previous version, still running during
-- a rolling upgrade, insert without it (readers then find the header end
-- themselves).
ALTER TABLE messages ADD COLUMN header_size BIGINT;
UPDATE messages SET header_size = (meta::json ->> 'header_size')::bigint;
