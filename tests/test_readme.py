"""README's settings table lists every setting (``farm.settings.Settings``) as its environment variable."""
from __future__ import annotations

import re

from farm.settings import Settings
from tests.chart import REPO


def test_every_setting_is_in_the_readme_table() -> None:
    text = (REPO / "README.md").read_text()
    table = text[text.index("### Settings"):]
    listed = set(re.findall(r"^\| `(FARM_[A-Z0-9_]+)` \|", table, flags=re.M))
    wanted = {f"FARM_{name.upper()}" for name in Settings.model_fields}
    assert wanted <= listed, f"missing from README's settings table: {sorted(wanted - listed)}"
