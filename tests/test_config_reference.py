"""docs/config.md is generated from the config models and must be current."""

from __future__ import annotations

from pathlib import Path

from argusdiff.config import Settings, reference_markdown

DOC = Path(__file__).resolve().parent.parent / "docs" / "config.md"


def test_config_reference_is_current():
    assert DOC.read_text(encoding="utf-8") == reference_markdown(), "run: python scripts/config_reference.py"


def test_every_field_is_documented():
    text = reference_markdown()
    for name, info in Settings.model_fields.items():
        section = type(info.default)
        if name == "profile":
            assert "`profile`" in text
            continue
        for field in section.model_fields:
            assert f"`{name}.{field}`" in text, (name, field)
