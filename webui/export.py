"""CSV downloads of the charts' data: the same rows the JSON API gives, one line each."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Sequence

from flask import Response


def _safe(value: object) -> object:
    # A cell a spreadsheet would run as a formula (=, +, -, @ first) gets a leading quote.
    if isinstance(value, str) and value[:1] in ("=", "+", "-", "@", "\t", "\r"):
        return "'" + value
    return value


def csv_response(header: Sequence[str], rows: Iterable[Sequence], filename: str) -> Response:
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(header)
    for row in rows:
        writer.writerow([_safe(v) for v in row])
    safe_name = "".join(c if c.isalnum() or c in "-_." else "_" for c in filename)
    return Response(out.getvalue(), mimetype="text/csv",
                    headers={"Content-Disposition": f'attachment; filename="{safe_name}"'})
