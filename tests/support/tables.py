"""A markdown table of result rows, as the bench scripts print them for docs/BENCHMARKS.md."""

from __future__ import annotations


def markdown_rows(rows: list[dict], cols: list[str]) -> str:
    """One line per row, `cols` in order; floats to 4 significant digits, a missing value empty."""
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        lines.append("| " + " | ".join(f"{r.get(c):.4g}" if isinstance(r.get(c), float) else str(r.get(c, ""))
                                       for c in cols) + " |")
    return "\n".join(lines)
