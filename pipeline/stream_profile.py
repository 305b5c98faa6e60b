"""What a video stream really is: profile, level, tier, reordering, read from the
bitstream (sans-IO, pure).

Rules:

- Input is an encoded frame as the pipeline receives it (:class:`pipeline.frame.
  EncodedFrame` data): Annex-B for H.264/H.265, a low-overhead temporal unit for AV1, a
  frame (or superframe) for VP9. :func:`read_stream_profile` returns a
  :class:`StreamProfile` or None (no parameter set in the frame, an unknown codec, or
  garbage): it never raises, and every read is bounded (:mod:`pipeline.bitreader`).
- H.264 (ITU-T H.264 7.3.2.1.1, E.1.1): the first SPS (NAL type 7), emulation
  prevention removed. ``reorder`` is the VUI's ``max_num_reorder_frames`` when the SPS
  has ``bitstream_restriction_flag``; else 0 where the profile has no B slices
  (baseline, constrained baseline, the intra profiles: constraint_set3 with
  profile_idc 44/100/110/122/244), else None (the stream *may* reorder).
- H.265 (7.3.2.2, 7.3.3, 7.3.2.1): the first SPS (type 33), else the first VPS (32), for
  profile_tier_level's general fields; from the SPS also ``sps_max_num_reorder_pics`` of
  the highest sub-layer (always present in an HEVC SPS).
- AV1 (5.5.1): the first sequence header OBU: ``seq_profile``, and ``seq_level_idx[0]``
  and ``seq_tier[0]`` of operating point 0 (reading stops there). AV1 has no B frames as
  H.264 has them (hidden frames are shown later by ``show_existing_frame``): ``reorder``
  is None.
- VP9 (6.2): the first frame's ``profile``; VP9 carries no level in the bitstream.
- Picture sizes, from the same parsers (one per header: a size reader stops where the
  size is, the profile reader reads on): :func:`read_h264_sps_size` (the cropped size,
  7.4.2.1.1: crop units from the chroma format and ``frame_mbs_only_flag``),
  :func:`read_h265_sps_size` (inside the conformance window, 7.4.3.2),
  :func:`read_av1_sequence_header_size` (``max_frame_width``/``height``: every operating
  point is read to reach them), :func:`read_vp9_keyframe_size` (a keyframe's
  ``frame_size()``, 7.2). Each reads only the bits up to the size, so a prefix of the
  header that holds them is enough (an RTP fragment). An SPS whose fields make no
  picture (a window past the frame, an unknown chroma format) still gives its profile;
  only its size is refused. Callers are :mod:`whip.rtc.layer_size` (simulcast layers).
- Names: profiles as the codec's specification names them, lower case, spaces as
  hyphens ("constrained-baseline", "high", "main10", "main" for AV1 profile 0); levels
  as they are written ("3.1", "4", "1b"; AV1 "X.Y" from ``2 + (idx >> 2)`` and
  ``idx & 3``; HEVC ``general_level_idc / 30``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from pipeline.av1_obu import OBU_SEQUENCE_HEADER, iter_obus
from pipeline.bitreader import BitReader, BitstreamError, strip_emulation_prevention
from pipeline.rtp_payload.errors import PayloadError

H264_NAL_SPS = 7
H265_NAL_VPS = 32
H265_NAL_SPS = 33
_START_CODE = b"\x00\x00\x01"
MAX_PARAMETER_SET_BYTES = 4096
"""A parameter set longer than this is not read past (real ones are under 200 bytes)."""

H264_HIGH_PROFILES = frozenset({100, 110, 122, 244, 44, 83, 86, 118, 128, 138, 139, 134, 135})
"""profile_idc values whose SPS carries chroma_format_idc and the bit depths."""
H264_INTRA_CAPABLE = frozenset({44, 100, 110, 122, 244})
"""With constraint_set3 these are the intra profiles (no inter prediction at all)."""


@dataclass(frozen=True, slots=True)
class StreamProfile:
    """The profile, level and reordering a video bitstream declares (module doc)."""

    codec: str
    """The pipeline's codec name: ``H264``, ``H265``, ``AV1``, ``VP9``."""
    profile: str | None
    level: str | None
    tier: str | None
    """``main`` or ``high`` for H.265 and AV1, None elsewhere."""
    reorder: int | None
    """Frames that may precede another in decode order and follow it in output order
    (0: no B-frames); None when the bitstream does not say."""
    reorder_source: str
    """Where ``reorder`` came from: ``vui``, ``sps``, ``profile`` or ``none``."""


def read_stream_profile(codec: str, data: bytes) -> StreamProfile | None:
    """The :class:`StreamProfile` declared in ``data`` (one encoded frame), or None."""
    name = codec.upper()
    try:
        if name == "H264":
            sps = _first_nal(data, lambda b: b & 0x1F == H264_NAL_SPS, 1)
            return read_h264_sps(sps) if sps is not None else None
        if name in ("H265", "HEVC"):
            sps = _first_nal(data, lambda b: (b >> 1) & 0x3F == H265_NAL_SPS, 2)
            if sps is not None:
                return read_h265_sps(sps)
            vps = _first_nal(data, lambda b: (b >> 1) & 0x3F == H265_NAL_VPS, 2)
            return read_h265_vps(vps) if vps is not None else None
        if name == "AV1":
            for obu_type, payload in iter_obus(data):
                if obu_type == OBU_SEQUENCE_HEADER:
                    return read_av1_sequence_header(bytes(payload[:MAX_PARAMETER_SET_BYTES]))
            return None
        if name == "VP9":
            return read_vp9_profile(data)
    except (BitstreamError, PayloadError):
        return None
    return None


def _first_nal(data: bytes, wanted: Callable[[int], bool], header_bytes: int) -> bytes | None:
    """The payload (after its ``header_bytes`` NAL header) of the first NAL unit whose
    first header byte passes ``wanted``, cut at the next start code and at
    :data:`MAX_PARAMETER_SET_BYTES`."""
    for start, end in _nal_spans(data):
        if end - start > header_bytes and data[start] & 0x80 == 0 and wanted(data[start]):
            stop = min(end, start + header_bytes + MAX_PARAMETER_SET_BYTES)
            return data[start + header_bytes : stop]
    return None


def _nal_spans(data: bytes) -> Iterator[tuple[int, int]]:
    """``(start, end)`` of each NAL unit after a start code (trailing zeros kept)."""
    i = data.find(_START_CODE)
    while i >= 0:
        start = i + 3
        nxt = data.find(_START_CODE, start)
        yield start, (nxt if nxt >= 0 else len(data))
        i = nxt


# ---------------------------------------------------------------- H.264


def h264_profile_name(profile_idc: int, constraints: int) -> str:
    """The H.264 profile's name (Annex A) from ``profile_idc`` and the constraint flags
    byte (``constraint_set0_flag`` is its top bit)."""
    set1 = bool(constraints & 0x40)
    set3 = bool(constraints & 0x10)
    set4 = bool(constraints & 0x08)
    set5 = bool(constraints & 0x04)
    if profile_idc == 66:
        return "constrained-baseline" if set1 else "baseline"
    if profile_idc == 77:
        return "main"
    if profile_idc == 88:
        return "extended"
    if profile_idc == 100:
        if set4 and set5:
            return "constrained-high"
        return "progressive-high" if set4 else "high"
    names = {110: "high10", 122: "high422", 244: "high444", 44: "cavlc444-intra"}
    if profile_idc in names:
        intra = set3 and profile_idc in (110, 122, 244)
        return names[profile_idc] + ("-intra" if intra else "")
    return f"profile-{profile_idc}"


def h264_level_name(level_idc: int, constraints: int, profile_idc: int) -> str:
    """``3.1`` for level_idc 31, ``4`` for 40, ``1b`` for 9 or for 11 with
    constraint_set3 in baseline/main/extended (A.3.1)."""
    if level_idc == 9 or (level_idc == 11 and constraints & 0x10 and profile_idc in (66, 77, 88)):
        return "1b"
    major, minor = divmod(level_idc, 10)
    return f"{major}" if minor == 0 else f"{major}.{minor}"


def read_h264_sps(payload: bytes) -> StreamProfile:
    """An H.264 SPS (the NAL payload after its 1-byte header). Raises
    :class:`BitstreamError` on truncated or out-of-range syntax."""
    r = BitReader(strip_emulation_prevention(payload))
    profile_idc, constraints, level_idc, _ = _h264_sps_through_cropping(r)
    profile = h264_profile_name(profile_idc, constraints)
    level = h264_level_name(level_idc, constraints, profile_idc)
    reorder = _h264_vui_reorder(r) if r.flag() else None
    if reorder is not None:
        return StreamProfile("H264", profile, level, None, reorder, "vui")
    no_b = profile_idc == 66 or (bool(constraints & 0x10) and profile_idc in H264_INTRA_CAPABLE)
    if no_b:
        return StreamProfile("H264", profile, level, None, 0, "profile")
    return StreamProfile("H264", profile, level, None, None, "none")


def read_h264_sps_size(payload: bytes) -> tuple[int, int]:
    """The cropped picture size ``(width, height)`` an H.264 SPS declares (the NAL payload
    after its 1-byte header; only the bits up to the cropping window are read, so a
    prefix of the SPS that holds them is enough). Raises :class:`BitstreamError`."""
    size = _h264_sps_through_cropping(BitReader(strip_emulation_prevention(payload)))[3]
    if size is None:
        raise BitstreamError("out_of_range", "no picture inside the cropping window")
    return size


def _h264_sps_through_cropping(r: BitReader) -> tuple[int, int, int, tuple[int, int] | None]:
    """``(profile_idc, constraint flags, level_idc, (width, height))``: 7.3.2.1.1 read up
    to and including the frame cropping window; the size is 7.4.2.1.1's cropped size, None
    when the fields make no picture (an unknown chroma format, a window past the frame):
    the profile is still read from such an SPS."""
    profile_idc = r.u(8)
    constraints = r.u(8)
    level_idc = r.u(8)
    r.ue()  # seq_parameter_set_id
    chroma_format_idc = 1  # inferred when absent
    separate_planes = False
    if profile_idc in H264_HIGH_PROFILES:
        chroma_format_idc = r.ue()
        if chroma_format_idc == 3:
            separate_planes = r.flag()  # separate_colour_plane_flag
        r.ue()  # bit_depth_luma_minus8
        r.ue()  # bit_depth_chroma_minus8
        r.skip(1)  # qpprime_y_zero_transform_bypass_flag
        if r.flag():  # seq_scaling_matrix_present_flag
            for i in range(8 if chroma_format_idc != 3 else 12):
                if r.flag():
                    _skip_scaling_list(r, 16 if i < 6 else 64)
    r.ue()  # log2_max_frame_num_minus4
    poc_type = r.ue()
    if poc_type == 0:
        r.ue()  # log2_max_pic_order_cnt_lsb_minus4
    elif poc_type == 1:
        r.skip(1)  # delta_pic_order_always_zero_flag
        r.se()  # offset_for_non_ref_pic
        r.se()  # offset_for_top_to_bottom_field
        cycle = r.ue()
        if cycle > 255:
            raise BitstreamError("out_of_range", f"num_ref_frames_in_pic_order_cnt_cycle {cycle}")
        for _ in range(cycle):
            r.se()
    r.ue()  # max_num_ref_frames
    r.skip(1)  # gaps_in_frame_num_value_allowed_flag
    width_mbs = r.ue() + 1  # pic_width_in_mbs_minus1
    height_map_units = r.ue() + 1  # pic_height_in_map_units_minus1
    frame_mbs_only = r.flag()
    if not frame_mbs_only:
        r.skip(1)  # mb_adaptive_frame_field_flag
    r.skip(1)  # direct_8x8_inference_flag
    crop = (r.ue(), r.ue(), r.ue(), r.ue()) if r.flag() else (0, 0, 0, 0)  # frame_cropping
    # 7.4.2.1.1: crop units are chroma samples (luma samples without chroma), doubled
    # vertically for field coding.
    fields = 1 if frame_mbs_only else 2
    if chroma_format_idc == 0 or separate_planes:
        unit_x, unit_y = 1, fields
    else:
        unit_x = 1 if chroma_format_idc == 3 else 2
        unit_y = fields * (2 if chroma_format_idc == 1 else 1)
    left, right, top, bottom = crop
    width = width_mbs * 16 - unit_x * (left + right)
    height = fields * height_map_units * 16 - unit_y * (top + bottom)
    valid = chroma_format_idc <= 3 and width > 0 and height > 0
    return profile_idc, constraints, level_idc, (width, height) if valid else None


def _skip_scaling_list(r: BitReader, size: int) -> None:
    last = nxt = 8
    for _ in range(size):
        if nxt != 0:
            nxt = (last + r.se() + 256) % 256
        last = nxt if nxt != 0 else last


def _h264_vui_reorder(r: BitReader) -> int | None:
    """Read the VUI (E.1.1) up to ``max_num_reorder_frames``; None without
    ``bitstream_restriction_flag``."""
    # aspect_ratio_info_present_flag, then aspect_ratio_idc == Extended_SAR: a SAR
    if r.flag() and r.u(8) == 255:
        r.skip(32)
    if r.flag():  # overscan_info_present_flag
        r.skip(1)
    if r.flag():  # video_signal_type_present_flag
        r.skip(4)
        if r.flag():  # colour_description_present_flag
            r.skip(24)
    if r.flag():  # chroma_loc_info_present_flag
        r.ue()
        r.ue()
    if r.flag():  # timing_info_present_flag
        r.skip(65)
    nal_hrd = r.flag()
    if nal_hrd:
        _skip_hrd(r)
    vcl_hrd = r.flag()
    if vcl_hrd:
        _skip_hrd(r)
    if nal_hrd or vcl_hrd:
        r.skip(1)  # low_delay_hrd_flag
    r.skip(1)  # pic_struct_present_flag
    if not r.flag():  # bitstream_restriction_flag
        return None
    r.skip(1)  # motion_vectors_over_pic_boundaries_flag
    for _ in range(4):  # max_bytes_per_pic_denom .. log2_max_mv_length_vertical
        r.ue()
    reorder = r.ue()
    r.ue()  # max_dec_frame_buffering
    return reorder


def _skip_hrd(r: BitReader) -> None:
    cpb_cnt = r.ue() + 1
    if cpb_cnt > 32:
        raise BitstreamError("out_of_range", f"cpb_cnt_minus1 {cpb_cnt - 1}")
    r.skip(8)  # bit_rate_scale, cpb_size_scale
    for _ in range(cpb_cnt):
        r.ue()
        r.ue()
        r.skip(1)
    r.skip(20)


# ---------------------------------------------------------------- H.265

H265_PROFILES = {
    1: "main",
    2: "main10",
    3: "main-still-picture",
    4: "rext",
    5: "high-throughput",
    6: "multiview-main",
    7: "scalable-main",
    8: "3d-main",
    9: "scc",
}


def h265_level_name(general_level_idc: int) -> str:
    """``general_level_idc`` is 30 times the level: 93 -> ``3.1``, 120 -> ``4``."""
    major, rest = divmod(general_level_idc, 30)
    minor = rest // 3
    return f"{major}" if minor == 0 else f"{major}.{minor}"


def _h265_profile_tier_level(r: BitReader, max_sub_layers_minus1: int) -> tuple[str, str, str]:
    """7.3.3 with ``profilePresentFlag`` 1: the general fields, sub-layers skipped."""
    r.skip(2)  # general_profile_space
    tier = "high" if r.flag() else "main"
    profile_idc = r.u(5)
    r.skip(32 + 4 + 43 + 1)  # compatibility flags, source flags, constraint bits
    level_idc = r.u(8)
    present = [(r.flag(), r.flag()) for _ in range(max_sub_layers_minus1)]
    if max_sub_layers_minus1 > 0:
        r.skip(2 * (8 - max_sub_layers_minus1))
    for profile_present, level_present in present:
        if profile_present:
            r.skip(88)
        if level_present:
            r.skip(8)
    profile = H265_PROFILES.get(profile_idc, f"profile-{profile_idc}")
    return profile, tier, h265_level_name(level_idc)


def read_h265_sps(payload: bytes) -> StreamProfile:
    """An H.265 SPS (the NAL payload after its 2-byte header)."""
    r = BitReader(strip_emulation_prevention(payload))
    profile, tier, level, max_sub_layers_minus1, _ = _h265_sps_through_conformance(r)
    r.ue()  # bit_depth_luma_minus8
    r.ue()  # bit_depth_chroma_minus8
    r.ue()  # log2_max_pic_order_cnt_lsb_minus4
    all_layers = r.flag()  # sps_sub_layer_ordering_info_present_flag
    reorder = 0
    for _ in range(0 if all_layers else max_sub_layers_minus1, max_sub_layers_minus1 + 1):
        r.ue()  # sps_max_dec_pic_buffering_minus1
        reorder = r.ue()  # sps_max_num_reorder_pics (the last is the highest sub-layer)
        r.ue()  # sps_max_latency_increase_plus1
    return StreamProfile("H265", profile, level, tier, reorder, "sps")


def read_h265_sps_size(payload: bytes) -> tuple[int, int]:
    """The picture size ``(width, height)`` inside an H.265 SPS's conformance window (the
    NAL payload after its 2-byte header; read up to the window only, so a prefix of the
    SPS that holds it is enough). Raises :class:`BitstreamError`."""
    size = _h265_sps_through_conformance(BitReader(strip_emulation_prevention(payload)))[4]
    if size is None:
        raise BitstreamError("out_of_range", "no picture inside the conformance window")
    return size


def _h265_sps_through_conformance(
    r: BitReader,
) -> tuple[str, str, str, int, tuple[int, int] | None]:
    """``(profile, tier, level, sps_max_sub_layers_minus1, (width, height))``: 7.3.2.2
    read up to and including the conformance window; the size is inside the window
    (7.4.3.2: offsets in chroma samples, SubWidthC/SubHeightC of table 6-1), None when
    the fields make no picture (the profile is still read)."""
    r.skip(4)  # sps_video_parameter_set_id
    max_sub_layers_minus1 = r.u(3)
    r.skip(1)  # sps_temporal_id_nesting_flag
    profile, tier, level = _h265_profile_tier_level(r, max_sub_layers_minus1)
    r.ue()  # sps_seq_parameter_set_id
    chroma_format_idc = r.ue()
    separate_planes = r.flag() if chroma_format_idc == 3 else False
    luma_width = r.ue()  # pic_width_in_luma_samples
    luma_height = r.ue()  # pic_height_in_luma_samples
    window = (r.ue(), r.ue(), r.ue(), r.ue()) if r.flag() else (0, 0, 0, 0)
    if chroma_format_idc == 0 or separate_planes:
        unit_x = unit_y = 1
    else:
        unit_x = 1 if chroma_format_idc == 3 else 2
        unit_y = 2 if chroma_format_idc == 1 else 1
    left, right, top, bottom = window
    width = luma_width - unit_x * (left + right)
    height = luma_height - unit_y * (top + bottom)
    valid = chroma_format_idc <= 3 and width > 0 and height > 0
    return profile, tier, level, max_sub_layers_minus1, (width, height) if valid else None


def read_h265_vps(payload: bytes) -> StreamProfile:
    """An H.265 VPS (the NAL payload after its 2-byte header): profile, tier, level."""
    r = BitReader(strip_emulation_prevention(payload))
    r.skip(4 + 1 + 1 + 6)  # vps id, base layer flags, vps_max_layers_minus1
    max_sub_layers_minus1 = r.u(3)
    r.skip(1 + 16)  # temporal id nesting, vps_reserved_0xffff_16bits
    profile, tier, level = _h265_profile_tier_level(r, max_sub_layers_minus1)
    return StreamProfile("H265", profile, level, tier, None, "none")


# ---------------------------------------------------------------- AV1 and VP9

AV1_PROFILES = {0: "main", 1: "high", 2: "professional"}
AV1_LEVEL_UNCONSTRAINED = 31


def av1_level_name(seq_level_idx: int) -> str:
    """``seq_level_idx`` 8 -> ``4.0`` (A.3); 31 (no level constraints) -> ``max``."""
    if seq_level_idx == AV1_LEVEL_UNCONSTRAINED:
        return "max"
    return f"{2 + (seq_level_idx >> 2)}.{seq_level_idx & 3}"


def read_av1_sequence_header(payload: bytes) -> StreamProfile:
    """An AV1 sequence header OBU's payload (5.5.1), up to operating point 0."""
    seq_profile, level_idx, tier, _ = _av1_sequence_header(BitReader(payload), size=False)
    profile = AV1_PROFILES.get(seq_profile, f"profile-{seq_profile}")
    return StreamProfile("AV1", profile, av1_level_name(level_idx), tier, None, "none")


def read_av1_sequence_header_size(payload: bytes) -> tuple[int, int]:
    """``(max_frame_width, max_frame_height)`` of an AV1 sequence header OBU's payload
    (5.5.1: every operating point is read to reach them). Raises :class:`BitstreamError`."""
    size = _av1_sequence_header(BitReader(payload), size=True)[3]
    assert size is not None
    return size


def _av1_sequence_header(
    r: BitReader, *, size: bool
) -> tuple[int, int, str, tuple[int, int] | None]:
    """``(seq_profile, seq_level_idx[0], seq_tier[0], max frame size)``: 5.5.1 read up to
    operating point 0's tier, and with ``size`` on to ``max_frame_height_minus_1``
    (else the size is None)."""
    seq_profile = r.u(3)
    r.skip(1)  # still_picture
    if r.flag():  # reduced_still_picture_header: one operating point, no models
        level_idx = r.u(5)
        return seq_profile, level_idx, "main", _av1_max_frame_size(r) if size else None
    decoder_model_info = False
    buffer_delay_bits = 0
    if r.flag():  # timing_info_present_flag
        r.skip(64)  # num_units_in_display_tick, time_scale
        if r.flag():  # equal_picture_interval
            r.uvlc()
        decoder_model_info = r.flag()
        if decoder_model_info:
            buffer_delay_bits = r.u(5) + 1  # buffer_delay_length_minus_1
            r.skip(32 + 5 + 5)
    initial_display_delay = r.flag()
    points = r.u(5) + 1  # operating_points_cnt_minus_1
    level_idx = 0
    tier = "main"
    for point in range(points):
        r.skip(12)  # operating_point_idc[i]
        point_level = r.u(5)
        point_tier = "high" if point_level > 7 and r.flag() else "main"
        if point == 0:
            level_idx, tier = point_level, point_tier
            if not size:
                return seq_profile, level_idx, tier, None
        if decoder_model_info and r.flag():  # decoder_model_present_for_this_op
            r.skip(2 * buffer_delay_bits + 1)  # operating_parameters_info
        if initial_display_delay and r.flag():
            r.skip(4)  # initial_display_delay_minus_1
    return seq_profile, level_idx, tier, _av1_max_frame_size(r)


def _av1_max_frame_size(r: BitReader) -> tuple[int, int]:
    width_bits = r.u(4) + 1  # frame_width_bits_minus_1
    height_bits = r.u(4) + 1  # frame_height_bits_minus_1
    width = r.u(width_bits) + 1  # max_frame_width_minus_1
    height = r.u(height_bits) + 1  # max_frame_height_minus_1
    return width, height


def read_vp9_profile(frame: bytes) -> StreamProfile | None:
    """The profile of a VP9 frame's uncompressed header (6.2); None without the frame
    marker."""
    profile = _vp9_profile(BitReader(frame[:2]))
    if profile is None:
        return None
    return StreamProfile("VP9", f"profile-{profile}", None, None, None, "none")


VP9_SYNC_CODE = 0x498342
VP9_CS_RGB = 7


def read_vp9_keyframe_size(frame: bytes) -> tuple[int, int] | None:
    """``(width, height)`` of a VP9 keyframe's uncompressed header (6.2: ``frame_sync_code``,
    ``color_config()``, ``frame_size()``); None for any other frame (no frame marker, a
    shown existing frame, an inter frame, a wrong sync code). Raises
    :class:`BitstreamError` when the header is cut short."""
    r = BitReader(frame[:16])
    profile = _vp9_profile(r)
    if profile is None:
        return None
    if r.flag():  # show_existing_frame
        return None
    if r.flag():  # frame_type: 1 is NON_KEY_FRAME
        return None
    r.skip(2)  # show_frame, error_resilient_mode
    if r.u(24) != VP9_SYNC_CODE:
        return None
    if profile >= 2:
        r.skip(1)  # ten_or_twelve_bit
    if r.u(3) != VP9_CS_RGB:  # color_space
        r.skip(1)  # color_range
        if profile in (1, 3):
            r.skip(3)  # subsampling_x, subsampling_y, reserved_zero
    elif profile in (1, 3):
        r.skip(1)  # reserved_zero
    return r.u(16) + 1, r.u(16) + 1  # frame_width_minus_1, frame_height_minus_1


def _vp9_profile(r: BitReader) -> int | None:
    """The profile after ``frame_marker`` (6.2; profile 3's reserved bit read too), None
    without the marker."""
    if r.u(2) != 2:  # frame_marker
        return None
    low = r.u(1)
    high = r.u(1)
    profile = (high << 1) | low
    if profile == 3:
        r.skip(1)  # reserved_zero
    return profile
