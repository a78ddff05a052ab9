-- Re-applied by `jobpulse db upgrade` whenever this file changes (docs/database.md): keep it
-- CREATE OR REPLACE-able; what cannot be replaced (a dropped column, a new signature) needs a migration.
CREATE OR REPLACE FUNCTION jobpulse.attr_bigint(attrs jsonb, key text) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$
SELECT CASE WHEN (attrs ->> key) ~ '^-?[0-9]{1,18}$' THEN (attrs ->> key)::bigint END
$$;
