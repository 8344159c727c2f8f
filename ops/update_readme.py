"""Regenerate the README's settings table from the settings model: `make readme`."""

from __future__ import annotations

import re
from pathlib import Path

from producer.protocol import Settings

README = Path(__file__).resolve().parents[1] / "README.md"
text = README.read_text()
new = re.sub(
    r"(<!-- settings:.*?-->\n)(.*?)(\n<!-- /settings -->)",
    lambda m: m.group(1) + Settings.table() + m.group(3),
    text,
    flags=re.S,
)
README.write_text(new)
print("README settings table:", "updated" if new != text else "already current")
