"""The machinery under the two trainer roles (policy, critic): the update runtime that
runs an UpdatePlan, its data-parallel process group, the pinned-memory park, and the
torch thread settings. Kept out of roles/ so a role file reads as the role's verbs."""
