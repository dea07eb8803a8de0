"""Data contracts every layer shares (the trajectory and PPO targets, the stage
names): nothing here imports upward."""
