"""Every peer connection a test or a bench makes comes from one factory.

``whip.rtc.peer.new_peer_connection()`` builds them with no ICE servers (aiortc's default
names a public STUN server, an address off this machine). An AST scan of ``tests/`` and
``bench/`` finds any other ``RTCPeerConnection(...)`` call, including in the programs a
bench runs with ``python -c`` (string constants). Subclassing is not a call: the server's
own peer connections (which a test may observe through a subclass) are the server's.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCANNED = sorted(
    path
    for path in [*(ROOT / "tests").rglob("*.py"), *(ROOT / "bench").rglob("*.py")]
    if path != Path(__file__).resolve()  # its own samples are the scanner's test
)


def _constructs_peer_connection(call: ast.Call) -> bool:
    func = call.func
    name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
    return name == "RTCPeerConnection"


def direct_constructions(source: str, filename: str) -> list[int]:
    """Lines of ``source`` (and of Python programs in its string constants) that call
    ``RTCPeerConnection(...)`` themselves."""
    lines: list[int] = []
    for node in ast.walk(ast.parse(source, filename=filename)):
        if isinstance(node, ast.Call) and _constructs_peer_connection(node):
            lines.append(node.lineno)
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and "RTCPeerConnection(" in node.value
        ):
            try:
                inner = direct_constructions(node.value, filename)
            except SyntaxError:  # prose, not a program
                continue
            lines += [node.lineno + line - 1 for line in inner]
    return lines


@pytest.mark.parametrize("path", SCANNED, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_peer_connections_come_from_the_factory(path: Path) -> None:
    assert direct_constructions(path.read_text(), str(path)) == [], (
        "use whip.rtc.peer.new_peer_connection()"
    )


def test_the_scan_finds_direct_constructions() -> None:
    source = (
        "import aiortc\n"
        "from aiortc import RTCPeerConnection, RTCConfiguration\n"
        "a = RTCPeerConnection()\n"
        "b = aiortc.RTCPeerConnection(RTCConfiguration(iceServers=[]))\n"
        "class Mine(RTCPeerConnection):\n"
        "    pass\n"
        'PROGRAM = """\n'
        "pc = RTCPeerConnection()\n"
        '"""\n'
        "from whip.rtc.peer import new_peer_connection\n"
        "c = new_peer_connection()\n"
    )
    assert direct_constructions(source, "x.py") == [3, 4, 8]
