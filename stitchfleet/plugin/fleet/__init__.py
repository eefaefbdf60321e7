"""The job's link to the fleet: its telemetry ledger, the shipper, the ingest client, the fleet's memory.

Input: what the hook reports (compiles, windows, reverts) and the settings. Output: rows in a database
or the operator's spool, and what the fleet already knows about a cluster. Never fails the job.
"""
