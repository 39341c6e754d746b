"""Query parameters shared by the list endpoints, with their bounds."""

from __future__ import annotations

from typing import Annotated

from fastapi import Query
from pydantic import AfterValidator

from app.models import IsoDatetime
from app.services.common import MAX_LIMIT
from app.services.interop import ExportFormat


def _no_nul(value: str | None) -> str | None:
    if value is not None and "\x00" in value:
        raise ValueError("text must not contain NUL characters")
    return value


Limit = Annotated[int, Query(ge=1, le=MAX_LIMIT, description=f"Page size, 1 to {MAX_LIMIT}.")]
Offset = Annotated[int, Query(ge=0, le=1_000_000_000, description="Rows to skip.")]
NameFilter = Annotated[
    str | None,
    Query(max_length=200, description="Case-insensitive substring of the name."),
    AfterValidator(_no_nul),
]
ExportFormatQuery = Annotated[
    ExportFormat,
    Query(description="cli: a verl command line with the right + prefixes; yaml: a verl YAML."),
]

Timestamp = IsoDatetime | None
