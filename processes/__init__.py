"""The processes a run starts and the role actors in them: Ray (started or
joined) and its fork server, the command line's temporary Prefect API, the role actors."""
