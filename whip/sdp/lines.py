"""SDP text as lines: the session part and each media section's lines, and back. Pure.

For the answer rewrites (:mod:`whip.sdp.answer`, :mod:`whip.sdp.congestion`,
:mod:`whip.sdp.simulcast`), which edit aiortc's answer line by line: CRLF or LF line ends
are read, blank lines dropped, and CRLF is written.
"""

from __future__ import annotations


def split_sections(sdp: str) -> tuple[list[str], list[list[str]]]:
    """The lines before the first ``m=``, and each media section's lines (its ``m=``
    first)."""
    session: list[str] = []
    media: list[list[str]] = []
    for raw in sdp.split("\n"):
        line = raw.removesuffix("\r")
        if line.startswith("m="):
            media.append([line])
        elif line:
            (media[-1] if media else session).append(line)
    return session, media


def join_sections(session: list[str], media: list[list[str]]) -> str:
    """SDP text of ``session`` and ``media`` lines, CRLF-terminated."""
    return "\r\n".join([*session, *(line for block in media for line in block)]) + "\r\n"
