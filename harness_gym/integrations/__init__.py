"""Bridges from harness episodes to trainers of other libraries (one module per library).

`harness_gym.integrations.trl`: a `rollout_func` for TRL's `GRPOTrainer` (needs the `trl` extra).
Modules here import their library lazily, so `import harness_gym.integrations` costs nothing.
"""
