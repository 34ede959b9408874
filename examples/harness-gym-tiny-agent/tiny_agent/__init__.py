"""tiny-agent: a minimal coding agent CLI, shipped with its harness-gym plugin spec."""
