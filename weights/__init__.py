"""How one policy version's weights travel from the policy to the rollout engines:
the publication manifest and its buckets, the transports that carry them (Ray's object
store, NIXL), and the engine-side fetch. Kept apart from trainer/ and roles/ so both
ends, and anything that starts a new engine, use the one protocol."""
