"""The DeepEP capability sheets say, per entry, how each capability is known: code and inferred
entries cite the upstream repository at a commit (``owner/repo@commit``), measured entries what
measured them; each sheet's file is named after the sheet (the runtime finds it by name)."""

import re

import pytest

from moepolicy._resources import sheet_files
from moepolicy.datasheets import deepep_sheets

CITED_AT_COMMIT = re.compile(r"\b[\w.-]+/[\w.-]+@[0-9a-f]{7,40}\b")


@pytest.mark.parametrize("name", sorted(deepep_sheets()))
def test_every_entry_cites_its_source(name):
    sheet = deepep_sheets()[name]
    missing = [
        f"{cap} ({layout}): {entry.source}"
        for cap, layouts in sheet.capabilities.items()
        for layout, entry in layouts.items()
        if entry.evidence in ("code", "inferred") and not CITED_AT_COMMIT.search(entry.source)
    ]
    assert not missing, "\n".join(missing)
    unmeasured = [
        cap
        for cap, layouts in sheet.capabilities.items()
        for entry in layouts.values()
        if entry.evidence == "measured" and not re.search(r"FACTS\.md|tests/gpu/", entry.source)
    ]
    assert not unmeasured


@pytest.mark.parametrize("name", sorted(deepep_sheets()))
def test_a_sheet_is_found_by_its_name(name):
    assert sheet_files(name)[0].is_file()
