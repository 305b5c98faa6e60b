"""The answer policy: the media stack's answer trimmed to the plan. Pure.

Answer policy (:func:`finalize_answer`): codecs filtered to the plan, ``a=recvonly``,
rejected sections reduced to port 0 and dropped from BUNDLE, ``a=end-of-candidates``,
and host candidates for the configured public addresses (:func:`add_host_candidates`).
"""

from __future__ import annotations

import hashlib
import ipaddress
from collections.abc import Sequence

from whip.sdp.lines import join_sections, split_sections
from whip.sdp.model import AnswerMismatchError, Direction, NothingReceivableError, OfferSummary
from whip.sdp.parse import PAYLOAD_TYPE

_DIRECTIONS = tuple(f"a={d}" for d in Direction)


def _pt_of(line: str) -> int | None:
    """The payload type an rtpmap/fmtp/rtcp-fb line is about, or None."""
    for prefix in ("a=rtpmap:", "a=fmtp:", "a=rtcp-fb:"):
        if line.startswith(prefix):
            head = line[len(prefix) :].split(" ", 1)[0]
            return int(head) if PAYLOAD_TYPE.fullmatch(head) else None
    return None


def _filter_block(block: list[str], keep: set[int]) -> list[str] | None:
    kind, port, proto, *formats = block[0][2:].split()
    kept = [f for f in formats if PAYLOAD_TYPE.fullmatch(f) and int(f) in keep]
    if not kept:
        return None
    lines = [f"m={kind} {port} {proto} {' '.join(kept)}"]
    for line in block[1:]:
        pt = _pt_of(line)
        if line in _DIRECTIONS and "a=recvonly" not in lines:
            lines.append("a=recvonly")  # the first direction line becomes recvonly, in place
        elif line not in _DIRECTIONS and (pt is None or pt in keep):
            lines.append(line)
    if "a=recvonly" not in lines:
        mid = next((i for i, line in enumerate(lines) if line.startswith("a=mid:")), 0)
        lines.insert(mid + 1, "a=recvonly")
    return lines


def _rejected_block(block: list[str]) -> list[str]:
    kind, _port, proto, *formats = block[0][2:].split()
    keep = [line for line in block[1:] if line.startswith(("c=", "a=mid:"))]
    return [f"m={kind} 0 {proto} {formats[0] if formats else '0'}", *keep]


def _candidate(line: str) -> tuple[str, int, str, int] | None:
    """(transport, component, address, port) of an ``a=candidate`` host line."""
    parts = line.removeprefix("a=candidate:").split()
    if not line.startswith("a=candidate:") or len(parts) < 8 or parts[6:8] != ["typ", "host"]:
        return None
    if not parts[1].isdigit() or not parts[5].isdigit():
        return None
    return parts[2].lower(), int(parts[1]), parts[4], int(parts[5])


def _ip(address: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(address)
    except ValueError:
        return None


def _host_candidates(block: list[str], hosts: Sequence[str]) -> list[str]:
    existing = [c for c in map(_candidate, block) if c is not None and c[0] == "udp"]
    added: list[str] = []
    for i, ip in enumerate(map(ipaddress.ip_address, hosts)):
        if not existing or any(_ip(c[2]) == ip for c in existing):
            continue
        for component in sorted({c[1] for c in existing}):
            mine = [c for c in existing if c[1] == component]
            same_family = [c for c in mine if (a := _ip(c[2])) and a.version == ip.version]
            port = (same_family or mine)[0][3]
            foundation = hashlib.sha256(f"public {ip}".encode()).hexdigest()[:16]
            priority = (126 << 24) | ((65534 - i) << 8) | (256 - component)
            added.append(
                f"a=candidate:{foundation} {component} udp {priority} {ip} {port} typ host"
            )
    if not added:
        return block
    last = max(i for i, line in enumerate(block) if line.startswith("a=candidate:"))
    return [*block[: last + 1], *added, *block[last + 1 :]]


def _end_of_candidates(block: list[str]) -> list[str]:
    if "a=end-of-candidates" in block:
        return block
    candidates = [i for i, line in enumerate(block) if line.startswith("a=candidate:")]
    at = candidates[-1] + 1 if candidates else len(block)
    return [*block[:at], "a=end-of-candidates", *block[at:]]


def add_host_candidates(sdp: str, hosts: Sequence[str]) -> str:
    """Add a UDP host candidate per address in ``hosts`` to every section with candidates.

    The port is the one of an existing UDP host candidate of the same component (of the
    same address family when there is one): the public address is expected to forward to
    the server's socket. Addresses already present are skipped. ``hosts`` must be IP
    literals (ValueError otherwise).
    """
    session, media = split_sections(sdp)
    return join_sections(session, [_host_candidates(block, hosts) for block in media])


def finalize_answer(sdp: str, summary: OfferSummary, public_hosts: Sequence[str] = ()) -> str:
    """Apply the answer policy to the media stack's answer for the offer of ``summary``.

    Accepted sections keep only the plan's payload types (and their rtpmap/fmtp/rtcp-fb
    lines), say ``a=recvonly``, list host candidates for ``public_hosts`` and end with
    ``a=end-of-candidates``. Rejected sections, and accepted ones left without a codec,
    become ``m=<kind> 0 <proto> <fmt>`` with only ``c=`` and ``a=mid`` and leave BUNDLE.
    Raises :class:`AnswerMismatchError` when the answer's sections do not match the
    offer's, :class:`NothingReceivableError` when no section is left.
    """
    session, media = split_sections(sdp)
    if len(media) != len(summary.sections):
        raise AnswerMismatchError(
            f"answer has {len(media)} media sections, the offer {len(summary.sections)}"
        )
    rejected: set[str] = set()
    out: list[list[str]] = []
    accepted = 0
    for plan, block in zip(summary.sections, media, strict=True):
        mid = next((line[6:] for line in block if line.startswith("a=mid:")), None)
        if plan.mid is not None and mid != plan.mid:
            raise AnswerMismatchError(f"answer section {plan.index} has mid {mid!r}")
        keep = {*plan.payload_types, *plan.rtx_payload_types}
        filtered = _filter_block(block, keep) if plan.accepted else None
        if filtered is None:
            out.append(_rejected_block(block))
            rejected.add(mid or "")
            continue
        accepted += 1
        out.append(_end_of_candidates(_host_candidates(filtered, public_hosts)))
    if not accepted:
        raise NothingReceivableError("the media stack accepted none of the receivable codecs")
    session = [_without_mids(line, rejected) for line in session if line not in _DIRECTIONS]
    return join_sections([line for line in session if line != "a=group:BUNDLE"], out)


def _without_mids(line: str, mids: set[str]) -> str:
    if not line.startswith("a=group:BUNDLE"):
        return line
    return " ".join(word for word in line.split(" ") if word not in mids)
