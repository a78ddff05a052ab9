-- Re-applied by `jobpulse db upgrade` whenever this file changes (docs/database.md): keep it
-- CREATE OR REPLACE-able; what cannot be replaced (a dropped column, a new signature) needs a migration.
CREATE OR REPLACE FUNCTION jobpulse.attr_number(attrs jsonb, key text) RETURNS double precision
LANGUAGE sql IMMUTABLE AS $$
SELECT CASE WHEN jsonb_typeof(attrs -> key) = 'number' THEN (attrs ->> key)::double precision END
$$;
