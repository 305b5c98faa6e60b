"""Arrival stamps on aioice's receive queue (:mod:`whip.rtc.arrival_stamps`): each datagram
keeps the time it was queued, the consumer takes it once, and the stamp goes on real aiortc
and aioice objects."""

from __future__ import annotations

import itertools

from aiortc import RTCCertificate, RTCDtlsTransport, RTCIceGatherer, RTCIceTransport

from whip.rtc.arrival_stamps import StampedQueue, internals_problems, stamp_arrivals
from whip.rtc.ice_restart import ice_connection


async def test_each_item_keeps_its_put_time_and_the_stamp_is_taken_once() -> None:
    ticks = itertools.count(100, 10)
    queue = StampedQueue(clock=lambda: next(ticks))
    for name in (b"a", b"b", b"c"):
        queue.put_nowait((name, 1))  # put at 100, 110, 120
    taken = []
    for _ in range(3):
        item = await queue.get()
        taken.append((item, queue.take_arrival(), queue.take_arrival()))
    assert taken == [((b"a", 1), 100, None), ((b"b", 1), 110, None), ((b"c", 1), 120, None)]
    queue.put_nowait(None)  # the connection's end is stamped like any item
    assert queue.get_nowait() is None and queue.take_arrival() == 130


async def test_the_stamp_goes_on_the_connection_under_a_dtls_transport() -> None:
    ice = RTCIceTransport(RTCIceGatherer())
    dtls = RTCDtlsTransport(ice, [RTCCertificate.generateCertificate()])
    connection = ice_connection(ice)
    connection.data_received(b"early", 1)  # queued before the stamp: moved over
    stamped = stamp_arrivals(dtls)
    assert connection._queue is stamped and stamp_arrivals(dtls) is stamped
    connection.data_received(b"late", 1)
    received = []
    for _ in range(2):  # what Connection.recvfrom does once connected (internals check)
        received.append(await connection._queue.get())
        received.append(stamped.take_arrival() is not None)
    assert received == [(b"early", 1), True, (b"late", 1), True]
    await dtls.stop()
    await ice.stop()


def test_the_aioice_internals_it_relies_on_are_there() -> None:
    assert internals_problems() == []
