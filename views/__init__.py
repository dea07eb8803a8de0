"""What the user sees of a run: the Prefect history artifacts, the reward curve,
the samples tables, the trackers, and the background thread that sends them."""
