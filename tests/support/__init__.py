"""Helpers the tests share: real servers, real publishers, media pushes, waits, guards.

One concept per module. Nothing here is a test, and production code never imports it.
``bench/`` never imports it either: a harness the benches run too (the SIGKILL loops, the
aiortc publisher, the ``/metrics`` reader, the server command line) lives in
``bench/support/`` and the tests import it from there.
"""
