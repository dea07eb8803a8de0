"""The `ppo` Prefect flow: role start-up, restore, the iteration loop, and its CLI."""
