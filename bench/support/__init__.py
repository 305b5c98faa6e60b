"""Helpers the bench scripts share, and the harnesses the tests drive too.

Rules: ``bench/`` imports production code (``whip``, ``pipeline``, ``registry``) and
these modules, never ``tests/`` (``tests/test_bench_isolation.py`` checks it). Where a
test and a bench run the same harness (the SIGKILL loops, the aiortc publisher, the
``/metrics`` reader, the server subprocess command line), it lives here and the tests
import it from here: one copy, owned by the side that must not depend on the other.

A bench script is run as ``python bench/<name>.py``, which puts ``bench/`` first on
``sys.path`` (and ``bench/whip.py`` would shadow the ``whip`` package): each script puts
the repository root first before importing, and imports these as ``bench.support.*``.
One concept per module, as in ``tests/support/``.
"""
