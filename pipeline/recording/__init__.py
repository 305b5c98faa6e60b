"""Recording by remux: each recorded session's encoded frames, stream-copied into
segment files (ARCHITECTURE.md "Integrations").

Modules, one concept each (each states its own rules):

- :mod:`pipeline.recording.codec_setup`: codec names, extradata from a keyframe, the
  ``OpusHead`` (sans-IO).
- :mod:`pipeline.recording.segment`: one segment file (PyAV stream copy, fragmented MP4
  or Matroska).
- :mod:`pipeline.recording.recorder`: one session's bounded queue and recorder thread,
  segment rotation, ``recording_segment`` / ``recording_failed``.
- :mod:`pipeline.recording.store`: the directory layout, the index of complete segments,
  the disk budget.
- :mod:`pipeline.recording.fmp4`: how much of a cut fragmented MP4 is whole (sans-IO).
- :mod:`pipeline.recording.recovery`: closing a segment a crash left unfinished.

Like the rest of ``pipeline``, nothing here imports aiortc or ``whip``.
"""
