"""The one table and section writer of the benchmarks' reports (issue 27 item 6): every
report (docs/benchmarks*.md) builds its Markdown tables with `markdown_table` and puts its
section into a shared document with `replace_section`. The plot is `report_plot.py`'s."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[object]],
                   align: str = "") -> list[str]:
    """A Markdown table as lines: `align` holds one letter per column, `l` (default) or `r`
    (right-aligned numbers, `---:`)."""
    marks = [("---:" if align[k:k + 1] == "r" else "---") for k in range(len(header))]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(marks) + "|"]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return lines


def replace_section(path: Path, heading: str, text: str, *, at_end: bool = False) -> None:
    """Put `text` (a section starting with `heading`, a `## ` line) into the Markdown file at
    `path`: where the section was (or, with `at_end`, moved to the end), appended when it is
    not there yet; the rest of the file is left as it is."""
    doc = path.read_text(encoding="utf-8") if path.exists() else ""
    start = doc.find(heading)
    if start >= 0:
        end = doc.find("\n## ", start + len(heading))
        rest = "" if end < 0 else doc[end + 1:]
        if at_end or end < 0:
            doc = (doc[:start].rstrip("\n") + ("\n\n" + rest if rest else "")).rstrip("\n")
            doc = doc + "\n\n" + text if doc else text
        else:
            doc = doc[:start] + text.rstrip("\n") + "\n\n" + rest
    else:
        doc = doc.rstrip("\n") + "\n\n" + text if doc.strip() else text
    path.write_text(doc.rstrip("\n") + "\n", encoding="utf-8")
