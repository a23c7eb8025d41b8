"""Each validation reason from a made-up bad PDF is quarantined while good files in the same run succeed."""

from __future__ import annotations

import pytest

from formats.records import sha256_hex
from parsing import Document, Dropped, Limits, Page, ParseConfig
from tests.parsing import fixtures as F

BAD = {
    "empty.pdf": (b"", "empty"),
    "garbage.pdf": (F.GARBAGE, "not_pdf"),
    "truncated.pdf": (F.truncated_pdf(), "truncated"),
    "encrypted.pdf": (F.encrypted_pdf(), "encrypted"),
    "zero.pdf": (F.zero_page_pdf(), "zero_pages"),
    "huge.pdf": (F.huge_page_pdf(), "page_too_large"),
}


def test_bad_files_quarantined_good_files_parsed_in_one_run(parser):
    config = ParseConfig(backend="mineru")
    inputs = [("good1.pdf", F.one_line_pdf("first good file"), None)]
    inputs += [(name, data, reason) for name, (data, reason) in BAD.items()]
    inputs += [("good2.pdf", F.owner_only_encrypted_pdf(), None), ("good3.pdf", F.one_line_pdf("third"), None)]
    for name, data, reason in inputs:
        recs = list(parser.iter_parse(data, name, config))
        if reason is None:
            assert isinstance(recs[0], Document), (name, recs[0])
            assert recs[0].doc_id == sha256_hex(data)
            pages = [r for r in recs[1:] if isinstance(r, Page)]
            assert [p.page_index for p in pages] == [0], (name, recs)
            assert pages[0].parser == "mineru-flash"
            assert any(b.text for b in pages[0].blocks)
        else:
            assert len(recs) == 1, (name, recs)
            (drop,) = recs
            assert isinstance(drop, Dropped)
            assert (drop.stage, drop.reason) == ("open", reason), (name, drop)
            assert drop.item_id == sha256_hex(data)
            assert drop.detail["source"] == name


@pytest.mark.parametrize(
    ("limits", "reason"),
    [(Limits(max_bytes=100), "too_large"), (Limits(max_pages=1), "too_many_pages")],
)
def test_size_limits(parser, limits, reason):
    recs = list(parser.iter_parse(F.paper_pdf(), "paper.pdf", ParseConfig(limits=limits)))
    assert [(type(r), r.reason) for r in recs] == [(Dropped, reason)]


def test_repaired_xref_is_accepted_and_noted():
    from parsing.validate import open_pdf

    data = bytearray(F.one_line_pdf("repair me"))
    pos = data.rindex(b"startxref")
    data[pos + 10 : pos + 14] = b"9999"  # point startxref at garbage; %%EOF stays
    opened = open_pdf(bytes(data), "broken-xref.pdf", Limits())
    assert not isinstance(opened, Dropped), opened
    document, doc = opened
    assert document.meta.get("repaired") is True
    assert "repair me" in doc[0].get_text()
