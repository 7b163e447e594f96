-- The header block's length beside the body, so FETCH of BODY[], BODY[HEADER],
-- BODY[TEXT] and HEADER.FIELDS reads the body row alone instead of decoding the
-- metadata document.
ALTER TABLE messages ADD COLUMN header_size INTEGER;
UPDATE messages SET header_size = json_extract(meta, '$.header_size');
