-- Notifications of flags, an outbox: a row per flag and channel (a site webhook, or the job's own
-- `notify` URL), written by the rule cycles, delivered by the leading collector with retries and
-- back-off. One per flag and channel (the unique key), whatever the cycles and restarts.
CREATE TABLE jobpulse.notifications (
    id           bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    flag_id      bigint      NOT NULL,
    channel      text        NOT NULL,  -- the site webhook's name, or 'user'
    url          text        NOT NULL,
    format       text        NOT NULL CHECK (format IN ('slack', 'json')),
    user_name    text,
    created_at   timestamptz NOT NULL DEFAULT now(),
    attempts     integer     NOT NULL DEFAULT 0,
    next_at      timestamptz NOT NULL DEFAULT now(),
    delivered_at timestamptz,
    given_up_at  timestamptz,
    last_error   text,
    UNIQUE (flag_id, channel)
);
CREATE INDEX notifications_due ON jobpulse.notifications (next_at) WHERE delivered_at IS NULL AND given_up_at IS NULL;
CREATE INDEX notifications_user ON jobpulse.notifications (user_name, delivered_at) WHERE channel = 'user';
