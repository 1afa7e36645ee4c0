"""Every MESSAGE_ID gpuwhy writes to the journal is explained in systemd/gpuwhy.catalog,
and nothing else defines one."""

import re
from pathlib import Path

from gpuwhy.journal import CHANGE_MESSAGE_IDS, MESSAGE_IDS

CATALOG = Path(__file__).resolve().parent.parent / "systemd" / "gpuwhy.catalog"


def test_every_message_id_has_a_catalog_entry():
    entries = re.findall(r"^-- ([0-9a-f]{32})$", CATALOG.read_text(), re.M)
    written = [*MESSAGE_IDS.values(), *CHANGE_MESSAGE_IDS.values()]
    assert len(set(written)) == len(written)
    assert sorted(entries) == sorted(written)
