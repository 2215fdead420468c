"""Tables as Markdown and LaTeX (booktabs, best in bold, as the paper's tables) and charts as PNG / SVG.

Tables arrive as the display text the page shows plus a mask of the best cells, so every export writes the
same numbers the page does. Charts are rendered by vl-convert (the Vega-Lite compiler and renderer as a
Python wheel, no browser).
"""

from __future__ import annotations

import altair as alt
import pandas as pd

# LaTeX's special characters in text cells (method labels like "CLIP+LA" pass; "50%" or "a_b" need escapes).
_LATEX_ESCAPES = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
                  "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}"}
_LATEX_TEXT = {"±": r"$\pm$", "Δ": r"$\Delta$", "—": "--", "τ": r"$\tau$"}


def _cells(text: pd.DataFrame) -> list[list[str]]:
    return [["" if pd.isna(v) else str(v) for v in row] for row in text.itertuples(index=False)]


def _mask(text: pd.DataFrame, best: pd.DataFrame | None) -> list[list[bool]]:
    if best is None:
        return [[False] * text.shape[1] for _ in range(len(text))]
    aligned = best.reindex(index=text.index, columns=text.columns, fill_value=False).fillna(False).astype(bool)
    return aligned.values.tolist()


def to_markdown(text: pd.DataFrame, best: pd.DataFrame | None = None) -> str:
    """A GitHub Markdown table; best cells in **bold**. Numbers right-aligned, text left."""
    header = [str(c) for c in text.columns]
    align = ["---:" if pd.api.types.is_numeric_dtype(text[c]) or _numeric_text(text[c]) else ":---"
             for c in text.columns]
    lines = ["| " + " | ".join(h.replace("|", r"\|") for h in header) + " |", "| " + " | ".join(align) + " |"]
    for cells, bold in zip(_cells(text), _mask(text, best)):
        shown = [f"**{c}**" if b and c else c for c, b in zip(cells, bold)]
        lines.append("| " + " | ".join(c.replace("|", r"\|") for c in shown) + " |")
    return "\n".join(lines) + "\n"


def _numeric_text(column: pd.Series) -> bool:
    """Cells like '61.81 ± 0.20' or '+1.02': numbers written as text."""
    values = column.dropna().astype(str)
    return bool(len(values)) and values.str.match(r"^[+\-−]?\d").all()


def latex_escape(text: str) -> str:
    out = "".join(_LATEX_ESCAPES.get(ch, ch) for ch in text)
    for raw, tex in _LATEX_TEXT.items():
        out = out.replace(raw, tex)
    return out


def to_latex(text: pd.DataFrame, best: pd.DataFrame | None = None, caption: str = "") -> str:
    """A booktabs tabular (\\toprule / \\midrule / \\bottomrule), best cells in \\textbf, as the paper's tables.
    Needs \\usepackage{booktabs} in the document."""
    spec = "".join("r" if pd.api.types.is_numeric_dtype(text[c]) or _numeric_text(text[c]) else "l"
                   for c in text.columns)
    lines = [r"\begin{table}[t]", r"\centering"]
    if caption:
        lines.append(rf"\caption{{{latex_escape(caption)}}}")
    lines += [rf"\begin{{tabular}}{{{spec}}}", r"\toprule",
              " & ".join(latex_escape(str(c)) for c in text.columns) + r" \\", r"\midrule"]
    for cells, bold in zip(_cells(text), _mask(text, best)):
        shown = [rf"\textbf{{{latex_escape(c)}}}" if b and c else latex_escape(c) for c, b in zip(cells, bold)]
        lines.append(" & ".join(shown) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}", r"\end{table}"]
    return "\n".join(lines) + "\n"


def chart_image(chart: alt.TopLevelMixin, fmt: str) -> bytes:
    """The chart as 'png' (2x scale) or 'svg' bytes, rendered by vl-convert."""
    import vl_convert as vlc  # a large native module: loaded on the first export only

    spec = chart.to_json()
    if fmt == "png":
        return vlc.vegalite_to_png(spec, scale=2)
    if fmt == "svg":
        return vlc.vegalite_to_svg(spec).encode("utf-8")
    raise ValueError(f"chart format must be 'png' or 'svg', got {fmt!r}")
