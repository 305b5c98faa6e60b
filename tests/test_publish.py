"""whip.publish's stop signals: SIGINT and SIGTERM ask, once, and the handlers come back.

The end-to-end proof (a real ``whip-ingest publish`` signalled while pushing to a real
server, its session deleted) is in ``tests/test_cli.py``
(``test_a_stop_signal_on_publish_deletes_the_session``).
"""

from __future__ import annotations

import signal
import threading

from whip.publish import STOP_SIGNALS, StopSignals


def test_stop_signals_record_the_first_signal_and_restore_the_handlers() -> None:
    before = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
    with StopSignals() as stop:
        assert stop.received is None
        signal.raise_signal(signal.SIGTERM)  # would end the process without the handler
        signal.raise_signal(signal.SIGINT)  # would raise KeyboardInterrupt
        assert stop.received is signal.SIGTERM
    assert {signum: signal.getsignal(signum) for signum in STOP_SIGNALS} == before


def test_stop_signals_install_nothing_off_the_main_thread() -> None:
    before = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
    seen: list[dict[signal.Signals, object]] = []

    def enter() -> None:
        with StopSignals() as stop:
            seen.append({signum: signal.getsignal(signum) for signum in STOP_SIGNALS})
            assert stop.received is None

    thread = threading.Thread(target=enter, name="stop-signals-off-main")
    thread.start()
    thread.join(10)
    assert not thread.is_alive()
    assert seen == [before]
