"""`python -m flows.ppo`: the command line of the `ppo` flow (`flows/ppo/__main__.py`).

The flow itself is flows/training.py and the command line cli/command.py. This package
holds only the entry point, and imports nothing, so `--validate-manifest` answers
before Prefect, Ray and torch are imported.
"""
