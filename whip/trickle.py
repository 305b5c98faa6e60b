"""Trickle ICE over PATCH (RFC 9725 section 4.3, RFC 8840 fragments). Sans-IO.

A PATCH body of type ``application/trickle-ice-sdpfrag`` carries ICE credentials,
``a=candidate`` lines grouped under ``m=``/``a=mid`` lines and possibly
``a=end-of-candidates``. Rules applied here:

- The body is UTF-8 text of at most :data:`MAX_FRAGMENT_BYTES`; at most
  :data:`MAX_CANDIDATES` candidates per request (each one makes the server send STUN
  checks to the address it names, so an unbounded list would be an amplifier).
- Credentials that differ from the session's current remote ``ice-ufrag`` mean an ICE
  restart. This server does not restart ICE and answers as RFC 9725 prescribes for that
  case: 422 (the publisher then makes a new POST).
- Every candidate line must parse; one bad line rejects the whole request (400) before
  anything is applied.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from whip.errors import HttpError

CONTENT_TYPE = "application/trickle-ice-sdpfrag"
MAX_FRAGMENT_BYTES = 16 * 1024
MAX_CANDIDATES = 32

_CANDIDATE = re.compile(
    r"candidate:\S{1,32} \d{1,5} (?:udp|UDP|tcp|TCP) \d{1,10} \S{1,64} \d{1,5} typ "
    r"(?:host|srflx|prflx|relay)(?: .{0,256})?"
)


class FragmentError(HttpError):
    """A malformed trickle fragment."""

    http_status = 400
    code = "bad_sdpfrag"


class FragmentTooLargeError(HttpError):
    """A trickle fragment over :data:`MAX_FRAGMENT_BYTES`."""

    http_status = 413
    code = "payload_too_large"

    def __init__(self) -> None:
        super().__init__(f"fragment larger than {MAX_FRAGMENT_BYTES} bytes")


class IceRestartUnsupportedError(HttpError):
    """The fragment asks for an ICE restart, which this server does not perform."""

    http_status = 422
    code = "ice_restart_unsupported"


@dataclass(frozen=True, slots=True)
class TrickleFragment:
    """What a PATCH asked for."""

    ice_ufrag: str | None
    ice_pwd: str | None
    candidates: tuple[str, ...]
    """``candidate:...`` values (without ``a=``), in order."""
    end_of_candidates: bool


def parse_fragment(body: bytes) -> TrickleFragment:
    """Parse and bound-check a fragment (raises :class:`FragmentError`, 413 on size)."""
    if len(body) > MAX_FRAGMENT_BYTES:
        raise FragmentTooLargeError()
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FragmentError("fragment is not UTF-8 text") from exc
    ufrag = pwd = None
    candidates: list[str] = []
    end = False
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        if len(line) < 2 or line[1] != "=":
            raise FragmentError(f"line {number}: not an SDP line")
        kind, value = line[0], line[2:]
        if kind == "m":
            continue
        if kind != "a":
            raise FragmentError(f"line {number}: unexpected {kind}= line in a fragment")
        name, _, arg = value.partition(":")
        if name == "ice-ufrag":
            ufrag = arg
        elif name == "ice-pwd":
            pwd = arg
        elif name == "candidate":
            if not _CANDIDATE.fullmatch(value):
                raise FragmentError(f"line {number}: malformed candidate")
            candidates.append(value)
        elif name == "end-of-candidates":
            end = True
    if len(candidates) > MAX_CANDIDATES:
        raise FragmentError(f"more than {MAX_CANDIDATES} candidates in one request")
    return TrickleFragment(ufrag, pwd, tuple(candidates), end)


def check_not_restart(fragment: TrickleFragment, current_ufrag: str | None) -> None:
    """Raise :class:`IceRestartUnsupportedError` if ``fragment`` changes credentials."""
    if fragment.ice_ufrag is not None and fragment.ice_ufrag != current_ufrag:
        raise IceRestartUnsupportedError(
            "ICE restart is not supported by this server; publish again with a new POST"
        )


_REMOTE_UFRAG = re.compile(r"^a=ice-ufrag:(\S+)", re.MULTILINE)


def remote_ufrag(sdp: str) -> str | None:
    """The first ``a=ice-ufrag`` of an SDP (the publisher's current credentials)."""
    match = _REMOTE_UFRAG.search(sdp)
    return match.group(1) if match else None
