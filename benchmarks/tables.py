"""The one Markdown table layout the benchmarks print (and docs/performance.md quotes)."""

from __future__ import annotations


def markdown_table(lines: list[list[str]], left_columns: int = 0) -> str:
    """lines[0] the header, the rest rows of cells; the first `left_columns` columns left-aligned, the others
    right-aligned (numbers), every column padded to its widest cell."""
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    out = ["| " + " | ".join(cell.ljust(w) if j < left_columns else cell.rjust(w)
                             for j, (cell, w) in enumerate(zip(line, widths))) + " |" for line in lines]
    out.insert(1, "|" + "|".join("-" * (w + 1) + ("-" if j < left_columns else ":")
                                 for j, w in enumerate(widths)) + "|")
    return "\n".join(out)
