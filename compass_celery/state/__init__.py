"""Cluster state in Redis: every key, the worker records, the store and its incremental
mirror, the snapshot reader, charges, and the connection and script helpers.
"""
