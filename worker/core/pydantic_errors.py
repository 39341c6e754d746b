"""What a pydantic validation error says is valid, for error messages that name the field, the value and
what is valid: the spec's issues (``worker.spec``) and the API's request errors (``app.errors``). Pure."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

DATETIME = "an ISO 8601 date-time, e.g. 2026-01-31T12:00:00Z"


def expected_list(expected: Any) -> Any:
    """pydantic's "'cli' or 'yaml'" -> ["cli", "yaml"]."""
    if not isinstance(expected, str):
        return expected
    parts = [p.strip().strip("'") for p in expected.replace(" or ", ",").split(",")]
    return [p for p in parts if p]


def _plural(n: Any, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


# Per pydantic error type, from the error's context.
VALID_BY_TYPE: dict[str, Callable[[dict[str, Any]], Any]] = {
    "greater_than_equal": lambda c: f">= {c['ge']}",
    "greater_than": lambda c: f"> {c['gt']}",
    "less_than_equal": lambda c: f"<= {c['le']}",
    "less_than": lambda c: f"< {c['lt']}",
    "multiple_of": lambda c: f"a multiple of {c['multiple_of']}",
    "string_too_short": lambda c: f"at least {_plural(c['min_length'], 'character')}",
    "string_too_long": lambda c: f"at most {_plural(c['max_length'], 'character')}",
    "too_short": lambda c: f"at least {_plural(c['min_length'], 'item')}",
    "too_long": lambda c: f"at most {_plural(c['max_length'], 'item')}",
    "string_pattern_mismatch": lambda c: f"text matching {c['pattern']}",
    "literal_error": lambda c: expected_list(c["expected"]),
    "enum": lambda c: expected_list(c["expected"]),
    "int_parsing": lambda c: "an integer",
    "int_type": lambda c: "an integer",
    "int_from_float": lambda c: "an integer",
    "int_parsing_size": lambda c: "an integer",
    "float_parsing": lambda c: "a number",
    "float_type": lambda c: "a number",
    "finite_number": lambda c: "a finite number",
    "bool_parsing": lambda c: "true or false",
    "bool_type": lambda c: "true or false",
    "string_type": lambda c: "a string",
    "string_unicode": lambda c: "a string",
    "dict_type": lambda c: "an object",
    "model_type": lambda c: "an object",
    "model_attributes_type": lambda c: "an object",
    "list_type": lambda c: "an array",
    "datetime_type": lambda c: DATETIME,
    "datetime_parsing": lambda c: DATETIME,
    "datetime_from_date_parsing": lambda c: DATETIME,
    "datetime_object_invalid": lambda c: DATETIME,
    "timezone_aware": lambda c: DATETIME,
    "json_invalid": lambda c: "a JSON document",
    "missing": lambda c: "a value: this field is required",
}


def valid_for(error: dict[str, Any]) -> Any:
    """What is valid for one pydantic error (an item of ``ValidationError.errors()``): from its type and
    context, else the rule its message states ("Input should be a valid UUID" -> "a valid UUID"; a
    validator's own sentence as it is). A custom error may carry ``valid`` in its context."""
    ctx = error.get("ctx") or {}
    if ctx.get("valid") is not None:
        return ctx["valid"]
    rule = VALID_BY_TYPE.get(error.get("type", ""))
    if rule is not None:
        try:
            return rule(ctx)
        except KeyError:
            pass
    message = str(error.get("msg", ""))
    message = message.removeprefix("Value error, ")
    if message.startswith("Input should be "):
        return message[len("Input should be "):].split(", ")[0]
    return message or None
