"""Multi-turn environments and tools (S-ENV): the seam a user's environment plugs into,
the tool-call formats model families write, and the turn-by-turn episode loop over a
rollout engine. Imports neither Ray nor Prefect."""
