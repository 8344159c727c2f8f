"""The README's settings table is the one the settings model renders."""

from __future__ import annotations

import re
from pathlib import Path

from producer.protocol import Settings

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_settings_table_is_generated_from_the_model() -> None:
    text = README.read_text()
    match = re.search(r"<!-- settings:.*?-->\n(.*?)\n<!-- /settings -->", text, re.S)
    assert match, "the README lost its settings markers"
    assert match.group(1) == Settings.table(), "run: make readme"
    for name in Settings.model_fields:
        assert f"`SANDFARM_{name.upper()}`" in match.group(1)


def test_readme_points_only_at_files_that_exist() -> None:
    text = README.read_text()
    links = re.findall(r"\]\(([^)#]+)\)", text)
    assert links, "the README lost its links"
    for link in links:
        assert not link.startswith(("../", "/")), f"link outside the repository: {link}"
        if "://" not in link:
            assert (README.parent / link).exists(), link
    for path in re.findall(r"\b((?:examples|ops)/[\w./-]+\.(?:json|jsonl|sh|py|md))\b", text):
        assert (README.parent / path).exists(), path
