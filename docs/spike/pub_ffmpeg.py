"""Publisher: PyAV's FFmpeg WHIP muxer, H.264 (libx264) + Opus, real-time
generated test pattern.

  python pub_ffmpeg.py http://127.0.0.1:8089/whip --seconds 10 [--dtls-active]
         [--verbose] [--fps 30] [--size 640x360]
"""
from __future__ import annotations

import argparse
import fractions
import json
import os
import sys
import time

import av
import numpy as np


def evt(t0: float, name: str, **data) -> None:
    print("PUB " + json.dumps({"evt": name, "ms": round((time.monotonic() - t0) * 1000, 1), **data}),
          flush=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--fps", type=int, default=30)
    ap.add_argument("--size", default="640x360")
    ap.add_argument("--dtls-active", action="store_true")
    ap.add_argument("--handshake-timeout", type=int, default=5000)
    ap.add_argument("--verbose", action="store_true")
    ap.add_argument("--no-audio", action="store_true")
    ap.add_argument("--gop", type=int, default=0, help="frames per GOP (default = fps)")
    args = ap.parse_args()

    if args.verbose:
        # FFmpeg's own stderr logger (the Python bridge drops VERBOSE lines)
        av.logging.restore_default_callback()
        av.logging.set_libav_level(av.logging.VERBOSE)

    w, h = map(int, args.size.split("x"))
    t0 = time.monotonic()
    evt(t0, "start", pid=os.getpid())
    opts = {"handshake_timeout": str(args.handshake_timeout)}
    if args.dtls_active:
        opts["whip_flags"] = "dtls_active"
    out = av.open(args.url, mode="w", format="whip", options=opts)
    evt(t0, "opened")

    v = out.add_stream("libx264", rate=args.fps)
    v.width, v.height, v.pix_fmt = w, h, "yuv420p"
    v.codec_context.gop_size = args.gop or args.fps  # default 1 s GOP
    v.codec_context.max_b_frames = 0
    v.codec_context.bit_rate = 1_000_000
    v.codec_context.options = {"preset": "ultrafast", "tune": "zerolatency", "profile": "baseline"}
    v.codec_context.time_base = fractions.Fraction(1, args.fps)
    a = None
    if not args.no_audio:
        a = out.add_stream("libopus", rate=48000, layout="stereo")
        a.codec_context.bit_rate = 64000

    yy, xx = np.mgrid[0:h, 0:w]
    base = np.zeros((h, w, 3), dtype=np.uint8)
    base[..., 0] = (xx * 255 // max(w - 1, 1)).astype(np.uint8)
    base[..., 1] = (yy * 255 // max(h - 1, 1)).astype(np.uint8)

    vi = ai = 0
    a_samples = 960
    tone = 2 * np.pi * 440 / 48000
    n_video = int(args.seconds * args.fps)
    n_audio = int(args.seconds * 50) if a is not None else 0
    header_done = False
    sent_bytes = 0
    last_report = 0.0
    t_media = None
    while vi < n_video or ai < n_audio:  # bounded by --seconds
        tv = vi / args.fps if vi < n_video else float("inf")
        ta = ai * 0.02 if ai < n_audio else float("inf")
        due = min(tv, ta)
        if t_media is not None:
            delay = t_media + due - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        if tv <= ta:
            img = base.copy()
            x = (vi * 8) % w
            img[:, x:x + 16, :] = 255
            img[..., 2] = (vi * 4) % 256
            frame = av.VideoFrame.from_ndarray(img, format="rgb24").reformat(format="yuv420p")
            frame.pts = vi
            frame.time_base = fractions.Fraction(1, args.fps)
            packets = v.encode(frame)
            vi += 1
        else:
            t = (np.arange(a_samples) + ai * a_samples) * tone
            mono = (np.sin(t) * 8000).astype(np.int16)
            st = np.repeat(mono, 2).reshape(1, -1)
            frame = av.AudioFrame.from_ndarray(st, format="s16", layout="stereo")
            frame.sample_rate = 48000
            frame.pts = ai * a_samples
            frame.time_base = fractions.Fraction(1, 48000)
            packets = a.encode(frame)
            ai += 1
        for p in packets:
            if not header_done:
                evt(t0, "first_mux_call")
            out.mux(p)
            sent_bytes += p.size
            if not header_done:
                header_done = True
                t_media = time.monotonic() - due  # start real-time clock after handshake
                evt(t0, "header_written_handshake_done")
        if t_media is not None and time.monotonic() - last_report > 5:
            last_report = time.monotonic()
            evt(t0, "progress", video_frames=vi, audio_frames=ai, bytes=sent_bytes)
    for s in (v, a):
        if s is not None:
            for p in s.encode(None):
                out.mux(p)
    evt(t0, "closing", video_frames=vi, audio_frames=ai, bytes=sent_bytes)
    out.close()
    evt(t0, "closed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
