"""The README's configuration reference is the one the code generates."""

from __future__ import annotations

from pathlib import Path

from whip.config import render_reference

README = Path(__file__).parent.parent / "README.md"


def test_readme_config_reference_matches_the_code() -> None:
    text = README.read_text(encoding="utf-8")
    start = text.index("<!-- config-reference:start -->\n") + len(
        "<!-- config-reference:start -->\n"
    )
    end = text.index("<!-- config-reference:end -->")
    assert text[start:end].strip() == render_reference().strip()
