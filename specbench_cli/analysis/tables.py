"""One table, four renderings: the terminal (rich), Markdown, CSV and LaTeX (booktabs)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from rich.console import Group, RenderableType
from rich.table import Table as RichTable
from rich.text import Text


@dataclass
class Table:
    name: str  # file stem
    title: str
    frame: pd.DataFrame
    note: str = ""
    terminal: bool = True  # printed by `report` (wide tables only go to files)

    def rich(self) -> RenderableType:
        """The terminal's table: a long method label (`eagle3[depth=0,top_k=1,total_token=2]`) shortened to its
        method and a number, spelled out in a legend under the table (the files keep every label whole)."""
        frame, legend = short_labels(self.frame)
        out = RichTable(title=Text(self.title), caption=Text(self.note) if self.note else None)
        for i, col in enumerate(frame.columns):
            # fold: a narrow terminal wraps a long id inside its cell instead of cutting it with an ellipsis
            out.add_column(str(col), justify="right" if i and _numeric(frame[col]) else "left", overflow="fold")
        for row in frame.itertuples(index=False):  # Text: a label such as eagle3[depth=4] is not markup
            out.add_row(*[Text(fmt(v)) for v in row])
        return Group(out, Text(legend)) if legend else out  # the legend as wide as the terminal, not the table

    def markdown(self) -> str:
        lines = ["| " + " | ".join(map(str, self.frame.columns)) + " |", "|" + "---|" * len(self.frame.columns)]
        lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in self.frame.itertuples(index=False)]
        return "\n".join(lines)

    def latex(self) -> str:
        cols = self.frame.columns
        spec = "l" + "".join("r" if _numeric(self.frame[c]) else "l" for c in cols[1:])
        body = [" & ".join(_tex(fmt(v)) for v in row) + r" \\" for row in self.frame.itertuples(index=False)]
        return "\n".join([rf"% {self.title}", rf"\begin{{tabular}}{{{spec}}}", r"\toprule",
                          " & ".join(_tex(str(c)) for c in cols) + r" \\", r"\midrule", *body, r"\bottomrule",
                          r"\end{tabular}", ""])

    def write(self, folder: Path) -> list[Path]:
        """<name>.md (title, table, note), .csv (full precision) and .tex."""
        folder.mkdir(parents=True, exist_ok=True)
        md, csv, tex = (folder / f"{self.name}.{ext}" for ext in ("md", "csv", "tex"))
        md.write_text(f"{self.title}\n\n{self.markdown()}\n" + (f"\n{self.note}\n" if self.note else ""))
        self.frame.to_csv(csv, index=False)
        tex.write_text(self.latex())
        return [md, csv, tex]


LABEL_WIDTH = 16  # a method label longer than this is shortened in the terminal


def short_labels(frame: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """`frame` with each long label of its `method` column as `eagle3 (1)`, and the legend that spells them out."""
    if "method" not in frame.columns:
        return frame, ""
    long = [label for label in dict.fromkeys(frame["method"].astype(str))
            if len(label) > LABEL_WIDTH and "[" in label]
    if not long:
        return frame, ""
    short = {label: f"{label.split('[')[0]} ({i})" for i, label in enumerate(long, 1)}
    legend = "; ".join(f"({i}) {label}" for i, label in enumerate(long, 1))
    return frame.assign(method=frame["method"].astype(str).map(lambda m: short.get(m, m))), legend


def fmt(v: object) -> str:
    if isinstance(v, float):
        return "—" if v != v else f"{v:.2f}"
    return str(v)


def _numeric(column: pd.Series) -> bool:
    return pd.api.types.is_numeric_dtype(column)


def _tex(text: str) -> str:
    for a, b in (("\\", r"\textbackslash{}"), ("&", r"\&"), ("%", r"\%"), ("_", r"\_"), ("#", r"\#"), ("—", "--"),
                 ("τ", r"$\tau$"), ("×", r"$\times$"), ("≥", r"$\geq$"), ("α", r"$\alpha$")):
        text = text.replace(a, b)
    return text
