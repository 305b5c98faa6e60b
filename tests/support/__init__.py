"""Helpers the tests share: real servers, real publishers, media pushes, crash writers.

One concept per module. Nothing here is a test; production code never imports it, and
neither does ``bench/`` (it has its own helpers).
"""
