"""The keys under which an elastic rollout reports the engine faults it survived with
the batch it generated (processes/rollout_fleet.py): two metrics, and the events the
rollout stage writes into its task run's log (then dropped from the record)."""

LOST_KEY = "fault/rollout_engines_lost"
REPLACE_SECONDS_KEY = "fault/rollout_replace_seconds"
FAULT_EVENTS = "fault/rollout_events"  # [[level, message], ...]: logged, never a metric
