"""Who is recorded and where: ``[recording]`` and the principals' ``record`` override
(:mod:`whip.config`, :mod:`whip.recordings`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from whip.auth import hash_token
from whip.config import ConfigError, build_config


def principal(name: str, **extra: object) -> dict[str, object]:
    return {"name": name, "role": "publisher", "token_sha256": hash_token(name), **extra}


def test_principals_override_recording_enabled() -> None:
    document = {
        "server": {"data_dir": "/srv/whip"},
        "principals": [
            principal("always", record=True),
            principal("never", record=False),
            principal("default"),
        ],
    }
    off = build_config(document, {}, {})
    assert [off.records(n) for n in ("always", "never", "default")] == [True, False, False]
    on = build_config({**document, "recording": {"enabled": True}}, {}, {})
    assert [on.records(n) for n in ("always", "never", "default")] == [True, False, True]
    assert on.recording.directory(on.server.data_dir) == Path("/srv/whip/recordings")
    env = {"WHIP_INGEST_RECORDING_DIR": "/mnt/rec", "WHIP_INGEST_RECORDING_FORMAT": "mkv"}
    moved = build_config(document, env, {})
    assert moved.recording.directory(moved.server.data_dir) == Path("/mnt/rec")
    assert moved.recording.format == "mkv"


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({"principals": [principal("a", record="yes")]}, "record must be a boolean"),
        ({"principals": [principal("a", recrd=True)]}, "needs exactly the keys"),
        ({"recording": {"format": "avi"}}, "recording.format"),
        ({"recording": {"segment_s": 0.5}}, "recording.segment_s"),
        ({"recording": {"max_bytes": -1}}, "recording.max_bytes"),
    ],
)
def test_bad_recording_config_is_refused(document: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        build_config(document, {}, {})


@pytest.mark.parametrize(
    "document",
    [
        {"recording": {"enabled": True}},
        {
            "principals": [
                {"name": "cam", "role": "publisher", "token_sha256": "0" * 64, "record": True}
            ]
        },
    ],
    ids=["enabled", "a-principal-records"],
)
def test_recording_is_refused_in_cluster_mode(document: dict[str, object]) -> None:
    cluster = {
        "cluster": {"store": "postgresql://127.0.0.1:1/none", "secret": "s" * 16},
    }
    with pytest.raises(ConfigError, match="recording is not available in cluster mode"):
        build_config({**document, **cluster}, {}, {})
    assert not build_config(cluster, {}, {}).recording.enabled  # cluster alone is fine
