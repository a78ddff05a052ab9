-- Re-applied by `jobpulse db upgrade` whenever this file changes (docs/database.md): keep it
-- CREATE OR REPLACE-able; what cannot be replaced (a dropped column, a new signature) needs a migration.
CREATE OR REPLACE FUNCTION jobpulse.pyramid_width(range_from timestamptz, range_to timestamptz) RETURNS smallint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT (CASE WHEN range_to - range_from <= interval '6 hours' THEN 300
                     WHEN range_to - range_from <= interval '36 hours' THEN 3600 ELSE 21600 END)::smallint $$;
