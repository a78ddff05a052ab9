-- A flag is told again when it rises to a higher severity: the hang claim's weak form (`stalled`,
-- info) becomes `hung` (critical, what the hang policy acts on) in the same flag row, and a channel
-- told of the note must hear of the hang. The outbox keeps a row per flag, channel and severity
-- told; a row written without one (rows from before) counts as told at the highest (never told again).
ALTER TABLE jobpulse.notifications ADD COLUMN severity text NOT NULL DEFAULT 'critical'
    CHECK (severity IN ('info', 'warning', 'critical'));
ALTER TABLE jobpulse.notifications DROP CONSTRAINT notifications_flag_id_channel_key;
ALTER TABLE jobpulse.notifications ADD UNIQUE (flag_id, channel, severity);
