"""How verdicts become flags: one flag per cause per job (`job_wide`)."""
