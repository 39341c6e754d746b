"""The error contract every 4xx of the API keeps (app/errors.py), checked in one place for the bad-input
table and the schemathesis fuzzer.

Every 4xx is JSON ``{"error": {"code", "message", "field", "value", "valid", "issues"}}`` with a code and a
sentence. Which statuses must also name the field, its value and what is valid:

- 400 (unreadable body), 409 (the request conflicts with the resource's state: a status that cannot change
  that way, a seq that leaves a gap) and 422 (an invalid input): all three are about something the request
  sent, so ``field`` names it, ``value`` is what was sent (null when it was missing) and ``valid`` says what
  would have been accepted.
- 404: ``field`` and ``value`` name the id that does not exist (or ``path`` for a route that does not);
  ``valid`` may be null: the valid ids are the rows that exist, which the list endpoints show.
- 401, 403, 405, 406, 413, 415, 429: about the credentials, their scope, the method, the size or type of the
  body, the rate, not about an input field: code and message only (the app adds field/value/valid where it
  has them, e.g. 405 lists the allowed methods).
"""

from __future__ import annotations

from typing import Any

NAMES_FIELD_VALUE_VALID = frozenset({400, 409, 422})
NAMES_FIELD_VALUE = NAMES_FIELD_VALUE_VALID | {404}


def assert_error_shape(status: int, body: Any) -> None:
    """Fail naming what is missing when a 4xx body breaks the contract above."""
    assert isinstance(body, dict) and isinstance(body.get("error"), dict), f"{status}: not an error body: {body!r}"
    error = body["error"]
    for key in ("code", "message"):
        assert isinstance(error.get(key), str) and error[key], f"{status}: no {key}: {error}"
    assert isinstance(error.get("issues"), list), f"{status}: issues is not a list: {error}"
    if status in NAMES_FIELD_VALUE:
        assert isinstance(error.get("field"), str) and error["field"], f"{status}: no field named: {error}"
        assert "value" in error, f"{status}: no value: {error}"
    if status in NAMES_FIELD_VALUE_VALID:
        assert error.get("valid") not in (None, "", [], {}), f"{status}: does not say what is valid: {error}"
