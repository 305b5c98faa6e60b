"""Durable state of whip-ingest: the write-ahead log, the run registry, warm event tails.

This package imports nothing else of ours (import direction: whip -> pipeline -> registry).
The entry point is :class:`registry.timeline.Timeline`.
"""
