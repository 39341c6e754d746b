"""schemathesis over the whole OpenAPI schema of the app, with a write token: no answer >= 500, every 4xx
in the error shape of ``tests/app/error_shape.py``, and every answer as the schema documents it.

How: ``SCHEMA.parametrize()`` makes one test per operation (31); schemathesis generates the cases from the
app's own ``/openapi.json`` (the test checks the copy it loaded at import is the one the app serves) in its
three stateless phases: ``examples`` (the documented examples, e.g. a tiny CPU run), ``coverage``
(deterministic boundary values, each parameter and body field violated, undeclared methods) and
``fuzzing`` (random cases, positive and negative, ``max_examples`` per operation). ``derandomize`` makes
the cases the same on every run. The cases go through the suite's TestClient (the app with its
lifespan, on the SQLite and PostgreSQL test databases); about 1,300 requests on SQLite and 150 on
PostgreSQL, where the coverage phase is not sent again: its cases probe validation, which runs before
the database and is the same on both.

The database holds a finished run with a fallback (so troubleshooting entry 1 exists), a queued run and a
queued trial; the coverage phase sends id 1 as the lower bound of every id, so the operations on an
existing run, entry, trial and token are reached as well as the 404s. Nothing is computed: runs go to
``RecordingLauncher`` (the Ray launcher runs real runs in its own tests) and trials are stored, not
started. ``/wait`` is asked with ``timeout=0`` (it would otherwise hold a queued run's request up to 300 s).

Checks: schemathesis's response checks (server errors, status codes, content types, bodies and headers as
documented, schema-violating requests rejected, undeclared methods answered 405 with a true ``Allow``,
missing required headers) plus the error shape. Left out: ``positive_data_acceptance`` (a spec is a JSON
object in the schema, but whether it is a valid run is decided by verl's rules and the cross-field checks,
which JSON Schema cannot state: such 422s are checked for their shape instead), and the checks that send
requests of their own over the network (``ignored_auth``: ``tests/app/test_auth.py`` checks that every
mutating route needs a token) or need stateful links (``use_after_free``, ``ensure_resource_availability``).
``tests/app/test_fuzz.py`` stays: it sends what a schema-driven fuzzer does not (NaN literals, NUL characters
and lone surrogates, deep nesting, verl command-line fragments).
"""

from __future__ import annotations

import collections
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    allow_header_conformance,
    content_type_conformance,
    missing_required_header,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
    unsupported_method,
)

from app.deps import get_trial_starter
from app.models_troubleshooting import TrialCreate
from app.services import trials as trials_service
from tests.app.error_shape import assert_error_shape
from tests.app.factories import RecordingLauncher, tiny_spec
from tests.app.pages_support import engine_events, stored_run


def served_openapi() -> dict[str, Any]:
    """The app's OpenAPI schema, from an app built only for it (no database is opened)."""
    from app.core.config import Settings
    from app.main import create_app

    app = create_app(Settings(DATA_DIR=tempfile.mkdtemp(prefix="attnboard-openapi-"), DATABASE_URL="sqlite://"),
                     migrate=False)
    try:
        return app.openapi()
    finally:
        app.state.engine.dispose()


SCHEMA = schemathesis.openapi.from_dict(served_openapi())
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance,
          response_headers_conformance, negative_data_rejection, unsupported_method, allow_header_conformance,
          missing_required_header]
MAX_EXAMPLES = 5


def error_body_names_the_field(ctx: Any, response: Any, case: Any) -> bool:
    """schemathesis check: every 4xx keeps the error contract."""
    if 400 <= response.status_code < 500:
        assert_error_shape(response.status_code, response.json())
    return True


def send(client: Any, case: Any, headers: dict[str, str]) -> Any:
    """The case as schemathesis would send it (``as_transport_kwargs``), through the suite's TestClient."""
    kwargs = case.as_transport_kwargs(base_url="http://testserver", headers=headers)
    body = {"json": kwargs["json"]} if "json" in kwargs else {"content": kwargs["data"]} if "data" in kwargs else {}
    return client.request(kwargs["method"], kwargs["url"], params=kwargs.get("params"), headers=kwargs.get("headers"),
                          cookies=kwargs.get("cookies"), **body)


@pytest.fixture(scope="module")
def tally() -> Iterator[collections.Counter]:
    """Requests sent, per backend and status (printed at the end with ``-s``)."""
    counts: collections.Counter = collections.Counter()
    yield counts
    print(f"\nschemathesis: {sum(counts.values())} requests; " + ", ".join(
        f"{backend} {status}: {n}" for (backend, status), n in sorted(counts.items())))


@pytest.fixture
def fuzz_target(api, session, write_headers) -> dict[str, str]:
    """The stored rows the cases can reach (see the module docstring); the write token's headers."""
    stored_run(session, name="fell back", events=engine_events("critic_fallback"))
    stored_run(session, name="queued")
    trials_service.create_trial(session, data=TrialCreate(spec=tiny_spec()), author="fuzz")
    api.dependency_overrides[get_trial_starter] = lambda: (lambda trial_id: None)
    api.state.launcher = RecordingLauncher()
    return write_headers


def test_the_fuzzed_schema_is_the_served_one(client):
    assert client.get("/openapi.json").json() == SCHEMA.raw_schema


@SCHEMA.parametrize()
@settings(max_examples=MAX_EXAMPLES, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
def test_every_operation(case, client, db_backend, fuzz_target, tally):
    if db_backend == "postgres" and case.meta is not None and case.meta.phase.name.value == "coverage":
        return  # validation probes: sent on SQLite (module docstring)
    if case.path.endswith("/wait") and case.query:
        case.query["timeout"] = 0
    response = send(client, case, fuzz_target)
    tally[db_backend, response.status_code] += 1
    case.validate_response(response, checks=CHECKS, additional_checks=[error_body_names_the_field])
