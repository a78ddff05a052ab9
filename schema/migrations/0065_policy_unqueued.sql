-- A policy set to act only while others wait (only_while_queued) records, once per job, that it held
-- back because no job waited for GPUs in the job's partition (or no fresh reading said so).
ALTER TABLE jobpulse.policy_actions DROP CONSTRAINT policy_actions_action_check;
ALTER TABLE jobpulse.policy_actions ADD CONSTRAINT policy_actions_action_check
    CHECK (action IN ('warned', 'cancelled', 'would_cancel', 'requeued', 'would_requeue', 'exempt',
                      'held_hardware', 'failed', 'unqueued'));
