-- The site policy acts on hung jobs as well as idle GPUs: each action row says which policy took it
-- (a job warned for an idle GPU is warned again when it hangs), and a hung job may be requeued.
ALTER TABLE jobpulse.policy_actions ADD COLUMN policy text NOT NULL DEFAULT 'idle_gpu';
ALTER TABLE jobpulse.policy_actions DROP CONSTRAINT policy_actions_action_check;
ALTER TABLE jobpulse.policy_actions ADD CONSTRAINT policy_actions_action_check
    CHECK (action IN ('warned', 'cancelled', 'would_cancel', 'requeued', 'would_requeue', 'exempt',
                      'held_hardware', 'failed'));
ALTER TABLE jobpulse.policy_actions DROP CONSTRAINT policy_actions_cluster_job_id_action_key;
ALTER TABLE jobpulse.policy_actions ADD CONSTRAINT policy_actions_cluster_job_id_policy_action_key
    UNIQUE (cluster, job_id, policy, action);
