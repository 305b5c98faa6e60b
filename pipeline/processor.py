"""Frame processor plug-ins: the protocol, the loader, and the output check.

A *frame processor* is any object with ``process(frame, meta)`` returning an iterable
of ``(event_type, data)`` pairs (``[]`` for none). Operators list them in the
configuration as ``"package.module:attribute"`` (``[pipeline] processors``); each session
loads its own with :func:`load_processor`, where the attribute is

- a class: instantiated with no arguments (one instance per session), or
- a factory function: called with no arguments (one instance per session), or
- an instance (anything with a callable ``process``): shared by every session, so it
  must be thread-safe on its own. Prefer a class.

Threads: ``process`` runs on a decode worker thread, never on the event loop, so it may
do numpy or FFmpeg work; the time it takes is decode time (a slow processor backs the
track's queue up until frames drop). A processor sees frames of every track kind unless
it has a ``kinds`` attribute (``("video",)``, ``("audio",)``); the frames of different
tracks come from different threads, and :class:`pipeline.analysis.Analysis` serializes
the calls to one processor instance, so it needs no locking of its own.

Output: event types match ``[a-z][a-z0-9_]{0,63}`` and may not be one of the types the
system writes (:class:`registry.events.EventType`: a plug-in adds types, it cannot forge
``session_closed`` or ``scene_change``); data is a JSON object (string keys, finite
numbers) of at most ``MAX_EVENT_DATA_BYTES`` encoded. It is copied on the way out, so a
processor may reuse its dicts. Anything else raises :class:`ProcessorOutputError`, and
any exception from ``process`` propagates: a processor's failure is its worker's
failure, which faults the session. Publishers cannot cause either; a bug can.

Example: :mod:`pipeline.examples.motion` (``pipeline.examples.motion:MotionDetector``).
"""

from __future__ import annotations

import importlib
import json
import re
from collections.abc import Collection, Iterable, Mapping
from typing import Protocol, cast, get_args

import av

from pipeline.decoder import FrameMeta
from pipeline.errors import PipelineError
from pipeline.frame import Kind
from registry.events import EventType

MAX_EVENT_DATA_BYTES = 16 * 1024
"""A plug-in event's data, JSON-encoded. The WAL's record limit (64 KiB by default) must
hold it with its envelope; a timeline is for events, not payloads."""

_DOTTED = r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*"
SPEC = re.compile(rf"(?P<module>{_DOTTED}):(?P<attr>{_DOTTED})")
"""``package.module:attribute`` (the attribute may be dotted: ``module:Class.factory``)."""
EVENT_TYPE = re.compile(r"[a-z][a-z0-9_]{0,63}")
RESERVED_TYPES = frozenset(EventType)
KINDS: frozenset[Kind] = frozenset(get_args(Kind))


class FrameProcessor(Protocol):
    """What the pipeline calls for every decoded frame (module doc)."""

    def process(
        self, frame: av.VideoFrame | av.AudioFrame, meta: FrameMeta
    ) -> Iterable[tuple[str, Mapping[str, object]]]: ...


class ProcessorLoadError(PipelineError):
    """A ``module:attribute`` spec does not name a usable frame processor."""

    def __init__(self, spec: str, problem: str) -> None:
        super().__init__(f"frame processor {spec!r}: {problem}")
        self.spec = spec


class ProcessorOutputError(PipelineError):
    """A frame processor returned something that is not a list of valid events."""


def load_processor(spec: str) -> FrameProcessor:
    """Import ``spec`` (``package.module:attribute``) and return a processor (module doc).

    Raises :class:`ProcessorLoadError` (the spec in its message, the cause chained) when
    the spec is malformed, the module does not import, the attribute is missing, is not
    callable, or makes something without a callable ``process``, or when the class or
    factory raises. Blocking: it imports a module; load once at start-up to check the
    configuration, then per session (the import is cached by then).
    """
    match = SPEC.fullmatch(spec) if isinstance(spec, str) else None
    if match is None:
        raise ProcessorLoadError(str(spec), "not 'package.module:attribute'")
    try:
        target: object = importlib.import_module(match["module"])
    except Exception as exc:
        raise ProcessorLoadError(spec, f"cannot import {match['module']!r}: {exc!r}") from exc
    for part in match["attr"].split("."):
        try:
            target = getattr(target, part)
        except AttributeError as exc:
            raise ProcessorLoadError(spec, f"no attribute {part!r}") from exc
    if not isinstance(target, type) and _has_process(target):
        processor_kinds(target, spec)
        return cast(FrameProcessor, target)
    if not callable(target):
        raise ProcessorLoadError(
            spec, f"a {type(target).__name__} is neither a class, a factory nor a processor"
        )
    try:
        made = target()
    except Exception as exc:
        raise ProcessorLoadError(spec, f"calling it with no arguments failed: {exc!r}") from exc
    if not _has_process(made):
        raise ProcessorLoadError(
            spec, f"it made a {type(made).__name__}, which has no callable process()"
        )
    processor_kinds(made, spec)
    return cast(FrameProcessor, made)


def _has_process(target: object) -> bool:
    return callable(getattr(target, "process", None))


def processor_kinds(processor: object, name: str | None = None) -> frozenset[Kind]:
    """The track kinds ``processor`` wants (its ``kinds`` attribute; all by default).

    Raises :class:`ProcessorLoadError` for a ``kinds`` that is not a collection of
    ``"video"`` / ``"audio"``.
    """
    kinds = getattr(processor, "kinds", None)
    if kinds is None:
        return KINDS
    label = name or processor_name(processor)
    if isinstance(kinds, str) or not isinstance(kinds, Collection):
        raise ProcessorLoadError(label, f"kinds must be a collection of kinds, got {kinds!r}")
    wanted = frozenset(kinds)
    if not wanted <= KINDS:
        raise ProcessorLoadError(
            label, f"kinds {sorted(map(str, wanted))} not within {sorted(KINDS)}"
        )
    return cast(frozenset[Kind], wanted)


def processor_name(processor: object) -> str:
    """A name for messages: ``module.Class`` of the instance."""
    kind = type(processor)
    return f"{kind.__module__}.{kind.__qualname__}"


def check_events(output: object, source: str) -> list[tuple[str, dict[str, object]]]:
    """Validate a processor's ``process`` result (module doc) and copy it.

    Returns the events as ``(type, data)`` with ``data`` a fresh JSON-clean dict; raises
    :class:`ProcessorOutputError` naming ``source`` for anything invalid.
    """
    if isinstance(output, str | bytes | bytearray | Mapping) or not isinstance(output, Iterable):
        raise ProcessorOutputError(
            f"{source}: process() must return an iterable of (event_type, data) pairs "
            f"([] for none), got {type(output).__name__}"
        )
    events: list[tuple[str, dict[str, object]]] = []
    for item in output:
        if not isinstance(item, tuple | list) or len(item) != 2:
            raise ProcessorOutputError(
                f"{source}: each event must be an (event_type, data) pair, got {item!r:.200}"
            )
        etype, data = item
        if not isinstance(etype, str) or not EVENT_TYPE.fullmatch(etype):
            raise ProcessorOutputError(
                f"{source}: event type {etype!r:.80} is not [a-z][a-z0-9_]{{0,63}}"
            )
        if etype in RESERVED_TYPES:
            raise ProcessorOutputError(
                f"{source}: event type {etype!r} is written by the system, not by plug-ins"
            )
        if not isinstance(data, Mapping) or not all(isinstance(k, str) for k in data):
            raise ProcessorOutputError(
                f"{source}: {etype} data must be a JSON object (a dict with string keys), "
                f"got {type(data).__name__}"
            )
        try:
            encoded = json.dumps(dict(data), allow_nan=False, separators=(",", ":"))
        except (TypeError, ValueError) as exc:
            raise ProcessorOutputError(f"{source}: {etype} data is not JSON: {exc}") from exc
        if len(encoded) > MAX_EVENT_DATA_BYTES:
            raise ProcessorOutputError(
                f"{source}: {etype} data is {len(encoded)} bytes as JSON, "
                f"over {MAX_EVENT_DATA_BYTES}"
            )
        events.append((etype, json.loads(encoded)))
    return events
