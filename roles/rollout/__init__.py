"""Rollout: one completion per prompt (S-FLOW-7) from an engine behind one interface."""
