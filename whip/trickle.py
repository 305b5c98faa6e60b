"""The PATCH rules of a WHIP session (RFC 9725 section 4.3, RFC 8840 fragments). Sans-IO.

A PATCH body of type ``application/trickle-ice-sdpfrag`` carries ICE credentials,
``a=candidate`` lines grouped under ``m=``/``a=mid`` lines and possibly
``a=end-of-candidates``. What a PATCH is, decided from its preconditions
(:func:`classify_patch`), in this order:

- ``If-Match: *``: an ICE restart. The fragment must carry a new ``a=ice-ufrag`` and
  ``a=ice-pwd`` (:func:`restart_credentials`; 400 otherwise).
- ``If-Match`` with entity tags: trickle ICE. One of them must be the session's current
  ETag, compared strongly (RFC 9110 section 13.1.1: a weak tag never matches); 412
  otherwise. A fragment naming credentials other than the session's current remote ones
  is 400 (they would be a restart, which needs ``*``).
- no ``If-Match`` but an ``ETag`` request header (Eyevinn's whip-web-client sends its tag
  that way): read as ``If-Match`` for trickle; ``*`` there is not a restart.
- neither: 428 Precondition Required (RFC 9725 section 4.3.1, RFC 6585 section 3).

Bounds: the body is UTF-8 text of at most :data:`MAX_FRAGMENT_BYTES`; at most
:data:`MAX_CANDIDATES` candidates per request (each one makes the server send STUN checks
to the address it names, so an unbounded list would be an amplifier). Every candidate line
must parse; one bad line rejects the whole request (400) before anything is applied.

A restart's answer (:func:`render_fragment`) carries the server's new credentials, the
answer's ``a=group:BUNDLE``, the bundle's ``m=`` line and ``a=mid`` and its candidates
(taken from the 201 answer by :func:`answer_layout`: the same sockets serve the new
generation), then ``a=end-of-candidates``.
"""

from __future__ import annotations

import enum
import re
import secrets
from dataclasses import dataclass

from whip.errors import HttpError

CONTENT_TYPE = "application/trickle-ice-sdpfrag"
MAX_FRAGMENT_BYTES = 16 * 1024
MAX_CANDIDATES = 32

_CANDIDATE = re.compile(
    r"candidate:\S{1,32} \d{1,5} (?:udp|UDP|tcp|TCP) \d{1,10} \S{1,64} \d{1,5} typ "
    r"(?:host|srflx|prflx|relay)(?: .{0,256})?"
)
ICE_CHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789+/"
_UFRAG = re.compile(r"[A-Za-z0-9+/]{4,256}")
_PWD = re.compile(r"[A-Za-z0-9+/]{22,256}")
_ENTITY_TAG = re.compile(r'\s*(W/)?("[\x21\x23-\x7e\x80-\xff]*")\s*')


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


class PreconditionRequiredError(HttpError):
    """A PATCH with neither ``If-Match`` nor an ``ETag`` request header."""

    http_status = 428
    code = "precondition_required"

    def __init__(self) -> None:
        super().__init__(
            'PATCH needs If-Match: the session\'s ETag to trickle, or "*" to restart ICE'
        )


class PreconditionFailedError(HttpError):
    """``If-Match`` names no current entity tag of the session."""

    http_status = 412
    code = "precondition_failed"

    def __init__(self) -> None:
        super().__init__("stale entity tag: the ICE session has changed")


@dataclass(frozen=True, slots=True)
class IceCredentials:
    """An ICE username fragment and password (RFC 8839 section 5.4 syntax)."""

    ufrag: str
    pwd: str

    def __post_init__(self) -> None:
        if not _UFRAG.fullmatch(self.ufrag):
            raise ValueError("ice-ufrag must be 4 to 256 ice-chars")
        if not _PWD.fullmatch(self.pwd):
            raise ValueError("ice-pwd must be 22 to 256 ice-chars")

    @classmethod
    def generate(cls) -> IceCredentials:
        """Fresh random credentials: a 16-char ufrag, as long as the server's first one
        (:data:`whip.rtc.ice_sockets.SERVER_UFRAG_LENGTH`), and a 32-char password."""

        def pick(n: int) -> str:
            return "".join(secrets.choice(ICE_CHARS) for _ in range(n))

        return cls(pick(16), pick(32))


@dataclass(frozen=True, slots=True)
class TrickleFragment:
    """What a PATCH asked for."""

    ice_ufrag: str | None
    ice_pwd: str | None
    candidates: tuple[str, ...]
    """``candidate:...`` values (without ``a=``), in order."""
    end_of_candidates: bool


def new_etag() -> str:
    """A fresh strong entity tag for an ICE session (RFC 9110 section 8.8.3)."""
    return f'"{secrets.token_hex(8)}"'


class PatchKind(enum.Enum):
    TRICKLE = "trickle"
    RESTART = "restart"


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


def _entity_tags(value: str) -> list[tuple[bool, str]] | None:
    """``(weak, opaque-tag)`` of each tag of an ``If-Match`` list, or None when the value
    is not a list of entity tags."""
    tags: list[tuple[bool, str]] = []
    for item in value.split(","):
        if not item.strip():
            continue  # RFC 9110 section 5.6.1: empty list elements are ignored
        match = _ENTITY_TAG.fullmatch(item)
        if match is None:
            return None
        tags.append((match.group(1) is not None, match.group(2)))
    return tags or None


def classify_patch(if_match: str | None, etag_header: str | None, current_etag: str) -> PatchKind:
    """What a PATCH is by its preconditions (module doc), or the 428/412 it gets."""
    if if_match is None:
        if etag_header is None:
            raise PreconditionRequiredError()
        tag = etag_header.strip()
        if_match = tag if tag.startswith(('"', "W/")) else f'"{tag}"'
    elif if_match.strip() == "*":
        return PatchKind.RESTART
    tags = _entity_tags(if_match)
    if tags is None or not any(not weak and tag == current_etag for weak, tag in tags):
        raise PreconditionFailedError()
    return PatchKind.TRICKLE


def check_trickle(fragment: TrickleFragment, current_ufrag: str | None) -> None:
    """400 if a trickle fragment names credentials other than the current remote ones."""
    if fragment.ice_ufrag is not None and fragment.ice_ufrag != current_ufrag:
        raise FragmentError(
            "the fragment's ice-ufrag is not the session's current one; "
            'an ICE restart needs If-Match: "*"'
        )


def restart_credentials(fragment: TrickleFragment, current_ufrag: str | None) -> IceCredentials:
    """The publisher's new credentials of a restart fragment (400 unless both are there,
    well formed and new)."""
    if fragment.ice_ufrag is None or fragment.ice_pwd is None:
        raise FragmentError("an ICE restart needs a=ice-ufrag and a=ice-pwd")
    try:
        credentials = IceCredentials(fragment.ice_ufrag, fragment.ice_pwd)
    except ValueError as exc:
        raise FragmentError(str(exc)) from exc
    if credentials.ufrag == current_ufrag:
        raise FragmentError("an ICE restart needs a new a=ice-ufrag")
    return credentials


@dataclass(frozen=True, slots=True)
class FragmentLayout:
    """The parts of an answer (or offer) a fragment repeats."""

    bundle: str | None
    """The ``a=group:BUNDLE ...`` line, if any."""
    media_line: str
    """The bundle's first ``m=`` line (or the first one at all)."""
    mid: str | None
    candidates: tuple[str, ...]
    """The ``a=candidate:`` lines of that section, whole."""


def answer_layout(sdp: str) -> FragmentLayout:
    """Read the bundle's first section of ``sdp`` (an answer this server sent)."""
    lines = [line.strip() for line in sdp.splitlines() if line.strip()]
    bundle = next((line for line in lines if line.startswith("a=group:BUNDLE")), None)
    tagged = bundle.split()[1] if bundle is not None and len(bundle.split()) > 1 else None
    sections: list[list[str]] = []
    for line in lines:
        if line.startswith("m="):
            sections.append([line])
        elif sections:
            sections[-1].append(line)
    if not sections:
        raise ValueError("no media section")

    def mid_of(section: list[str]) -> str | None:
        return next((line[6:] for line in section if line.startswith("a=mid:")), None)

    chosen = next((s for s in sections if tagged is not None and mid_of(s) == tagged), None)
    section = chosen or sections[0]
    candidates = tuple(line for line in section if line.startswith("a=candidate:"))
    return FragmentLayout(bundle, section[0], mid_of(section), candidates)


def render_fragment(
    credentials: IceCredentials, layout: FragmentLayout, *, end_of_candidates: bool = True
) -> str:
    """An ``application/trickle-ice-sdpfrag`` body: credentials, then the bundle's
    section with its candidates (RFC 8840 section 9 grammar)."""
    lines = [f"a=ice-ufrag:{credentials.ufrag}", f"a=ice-pwd:{credentials.pwd}"]
    if layout.bundle is not None:
        lines.append(layout.bundle)
    lines.append(layout.media_line)
    if layout.mid is not None:
        lines.append(f"a=mid:{layout.mid}")
    lines.extend(layout.candidates)
    if end_of_candidates:
        lines.append("a=end-of-candidates")
    return "\r\n".join(lines) + "\r\n"
