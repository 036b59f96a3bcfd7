"""The reference RLVR (GRPO) pipeline: rollout, rule rewards, group advantages, policy update,
weight sync, metrics and checkpoints, each role on its configured kind of device."""
