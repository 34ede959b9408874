"""Bridges from harness episodes to trainers of other libraries (one module per library).

`harness_gym.integrations.trl`: a `rollout_func` for TRL's `GRPOTrainer` (needs the `trl` extra).
Asynchronous GRPO (TRL's `AsyncGRPOTrainer` protocols): `async_grpo` (the rollout worker),
`weight_transfer` (weights into the serving engine), `async_loop` (the trainer loop on the CPU),
`rescore` (each token re-scored under the sampling that drew it), `checkpoint` (its checkpoints).
Modules here import their library lazily, so `import harness_gym.integrations` costs nothing.
"""
