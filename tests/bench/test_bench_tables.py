"""The benchmarks' one table and section writer (`needlepoint_bench.tables`)."""

from __future__ import annotations

from pathlib import Path

from needlepoint_bench.tables import markdown_table, replace_section

DOC = "# Title\n\n## A\n\na\n\n## B\n\nold b\n\n## C\n\nc\n"


def test_markdown_table() -> None:
    assert markdown_table(["x", "n"], [["a", 1], ["b", 2.5]], align="lr") == [
        "| x | n |", "|---|---:|", "| a | 1 |", "| b | 2.5 |"]


def test_a_section_is_replaced_in_place_or_moved_to_the_end(tmp_path: Path) -> None:
    doc = tmp_path / "doc.md"
    doc.write_text(DOC)
    replace_section(doc, "## B", "## B\n\nnew b\n")
    assert doc.read_text() == "# Title\n\n## A\n\na\n\n## B\n\nnew b\n\n## C\n\nc\n"
    replace_section(doc, "## A", "## A\n\nlast a", at_end=True)
    assert doc.read_text() == "# Title\n\n## B\n\nnew b\n\n## C\n\nc\n\n## A\n\nlast a\n"
    replace_section(doc, "## D", "## D\n\nd")
    assert doc.read_text().endswith("## A\n\nlast a\n\n## D\n\nd\n")
    fresh = tmp_path / "new.md"
    replace_section(fresh, "## E", "## E\n\ne")
    assert fresh.read_text() == "## E\n\ne\n"
