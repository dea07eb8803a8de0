"""One Prefect task per PPO stage; each a thin call into its role's actor."""
