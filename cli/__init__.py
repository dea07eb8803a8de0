"""The command line (`python -m flows.ppo`), its arguments, the manifest check, the
pre-flight refusals and the cleanup command."""
