"""A run's directory: its resolved config, lock, outputs and resume point."""
