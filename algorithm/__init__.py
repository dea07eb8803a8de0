"""PPO math with no Ray and no Prefect: GAE, losses, KL, the update plan, reward rules."""
