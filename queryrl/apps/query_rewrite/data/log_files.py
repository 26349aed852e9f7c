"""Reading a log file's cells: the sheets of ``.xlsx`` / ``.xls`` / ``.csv`` as grids, and date/time cells.

Grids keep every row, blank ones too, so row ``i`` of a grid is the spreadsheet's row ``i + 1``
and every message can name the row a user sees in Excel. Merged cells come back as the value in
the top-left cell and blanks below it (what :func:`~queryrl.apps.query_rewrite.data.log_import.fill_down`
repairs).
"""

from __future__ import annotations

import csv
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from pathlib import Path
from typing import Any

from queryrl.data.records import DataError


@dataclass(frozen=True)
class Uncomputed:
    """A formula cell of an ``.xlsx`` file that holds no computed result (the file was written by a program that
    does not compute formulas, e.g. a script with openpyxl): read as blank, reported as what it is."""

    formula: str

    def __str__(self) -> str:
        return ""


UNCOMPUTED_HELP = (
    "a formula without a saved result ({formula}; the file was written by a program that does not compute "
    "formulas): open the file in Excel or LibreOffice and save it, or export it as CSV"
)


def _sheet_rows(sheet: Any) -> list[tuple[Any, ...]]:
    # some exporters write a wrong <dimension> (e.g. "A1"); read-only mode would trust it and cut rows
    sheet.reset_dimensions()
    return [tuple(r) for r in sheet.iter_rows(min_row=1, values_only=True)]


def _xlsx_grids(source: Any) -> Iterator[tuple[str, list[tuple[Any, ...]]]]:
    import openpyxl

    # read-only streams the sheet; data_only gives a formula's last computed value (None where none was saved)
    book = openpyxl.load_workbook(source, read_only=True, data_only=True)
    try:
        grids = [(sheet.title, _sheet_rows(sheet)) for sheet in book.worksheets]
    finally:
        book.close()
    if any(cell is None for _, grid in grids for row in grid for cell in row):  # blanks: formulas among them?
        if hasattr(source, "seek"):
            source.seek(0)
        formulas = openpyxl.load_workbook(source, read_only=True, data_only=False)
        try:
            grids = [(title, _mark_uncomputed(grid, _sheet_rows(formulas[title]))) for title, grid in grids]
        finally:
            formulas.close()
    yield from grids


def _mark_uncomputed(values: list[tuple[Any, ...]], formulas: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """`values` with each blank cell whose twin in `formulas` is a formula replaced by :class:`Uncomputed`."""
    out = []
    for row, twin in zip(values, formulas, strict=False):
        out.append(
            tuple(
                Uncomputed(f) if v is None and isinstance(f, str) and f.startswith("=") else v
                for v, f in zip(row, twin, strict=False)
            )
            + row[len(twin) :]
        )
    return out + values[len(out) :]


def _xls_grids(path: Path) -> Iterator[tuple[str, list[tuple[Any, ...]]]]:
    with path.open("rb") as fh:
        magic = fh.read(4)
    if magic == b"PK\x03\x04":  # an .xlsx saved under an .xls name: CRMs do this
        with path.open("rb") as fh:  # a file object: openpyxl refuses the .xls name itself
            yield from _xlsx_grids(fh)
        return
    if magic[:1] == b"<" or magic.lower().startswith(b"\xef\xbb\xbf<"):
        raise DataError(f"{path}: an HTML table saved as .xls, not an Excel file; open it in Excel and save as .xlsx")
    import xlrd

    book = xlrd.open_workbook(str(path))
    for sheet in book.sheets():
        grid = []
        for r in range(sheet.nrows):
            cells: list[Any] = []
            for cell in sheet.row(r):
                if cell.ctype in (xlrd.XL_CELL_EMPTY, xlrd.XL_CELL_BLANK, xlrd.XL_CELL_ERROR):
                    cells.append(None)
                elif cell.ctype == xlrd.XL_CELL_DATE:
                    cells.append(xlrd.xldate_as_datetime(cell.value, book.datemode))
                elif cell.ctype == xlrd.XL_CELL_BOOLEAN:
                    cells.append(bool(cell.value))
                else:
                    cells.append(cell.value)
            grid.append(tuple(cells))
        yield sheet.name, grid


def _csv_grid(path: Path) -> list[tuple[Any, ...]]:
    # CRM CSVs from Chinese Excel installs are often GBK (gb18030 is its superset)
    for encoding in ("utf-8-sig", "gb18030"):
        try:
            with path.open(encoding=encoding, newline="") as fh:
                return [tuple(row) for row in csv.reader(fh)]
        except UnicodeDecodeError:
            continue
    raise DataError(f"{path}: cannot decode the CSV as UTF-8 or GB18030; save it as UTF-8")


def read_grids(path: Path, sheet: str | None = None) -> list[tuple[str | None, list[tuple[Any, ...]]]]:
    """``(sheet, rows of cells)`` of every sheet (or the one named; ``None`` for a CSV), row 1 first.

    Raises:
        DataError: an unreadable file or a sheet that is not there (naming the sheets).
    """
    suffix = path.suffix.lower()
    try:
        if suffix == ".csv":
            return [(None, _csv_grid(path))]
        grids: list[tuple[str | None, list[tuple[Any, ...]]]] = list(
            _xlsx_grids(path) if suffix == ".xlsx" else _xls_grids(path)
        )
    except DataError:
        raise
    except Exception as exc:
        raise DataError(f"{path}: cannot read {suffix} file: {exc}") from None
    if sheet is not None:
        names = [name for name, _ in grids]
        if sheet not in names:
            raise DataError(f"{path}: no sheet {sheet!r}; sheets: {', '.join(map(repr, names))}")
        grids = [g for g in grids if g[0] == sheet]
    return grids


_DATE_PART = re.compile(r"^(\d{4})\s*[年/.\-]\s*(\d{1,2})\s*[月/.\-]\s*(\d{1,2})\s*日?")
_TIME_FORMATS = ("%Y-%m-%d %H:%M:%S.%f", "%Y-%m-%d %H:%M:%S", "%Y-%m-%d %H:%M", "%Y-%m-%d", "%H:%M:%S", "%H:%M")
_EXCEL_EPOCH = datetime(1899, 12, 30)  # Excel's day 0 (with its 1900 leap-year quirk absorbed)
_DAY0 = date(1900, 1, 1)  # a time of day alone sorts on this date


def parse_time(value: Any) -> datetime:
    """A date/time cell as a naive datetime (aware ones converted to UTC).

    Accepts Excel datetimes, dates and times, Excel serial numbers (below 10**6), Unix seconds
    or milliseconds (larger numbers), and strings such as ``2026-11-03 14:05:09``,
    ``2026/11/3 14:05``, ``2026.11.03``, ``2026年11月3日 14时05分``, ISO 8601 (``T``, zone) or
    ``14:05:09`` (a time alone sorts on one fixed day).

    Raises:
        ValueError: anything else.
    """
    if isinstance(value, datetime):
        moment = value
    elif isinstance(value, date):
        moment = datetime.combine(value, time())
    elif isinstance(value, time):
        moment = datetime.combine(_DAY0, value)
    elif isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        if value < 1e6:
            moment = _EXCEL_EPOCH + timedelta(days=float(value))
        else:
            seconds = value / 1000 if value >= 1e11 else value
            moment = datetime.fromtimestamp(seconds, tz=UTC)
    elif isinstance(value, str):
        moment = _parse_time_text(value)
    else:
        raise ValueError(f"not a date/time: {value!r}")
    if moment.tzinfo is not None:
        moment = moment.astimezone(UTC).replace(tzinfo=None)
    return moment


def _parse_time_text(value: str) -> datetime:
    text = value.strip()
    date_part = _DATE_PART.match(text)
    if date_part:
        year, month, day = date_part.groups()
        rest = text[date_part.end() :].strip().lstrip("T").strip()
        rest = re.sub(r"[时点分]", ":", rest).replace("秒", "").rstrip(":")
        text = f"{year}-{int(month):02d}-{int(day):02d}" + (f" {rest}" if rest else "")
    for form in _TIME_FORMATS:
        try:
            parsed = datetime.strptime(text, form)
        except ValueError:
            continue
        return datetime.combine(_DAY0, parsed.time()) if not form.startswith("%Y") else parsed
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(
            f"not a date/time: {value!r} (e.g. 2026-11-03 14:05:09, 2026/11/3 14:05, 2026年11月3日 14:05)"
        ) from None
