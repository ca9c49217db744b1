"""Shared test fixtures: the network guard and the fake Messages API server.

- ``pytest_configure`` sets ``AGENTMEND_TESTING=1`` (unless already set), so runtimes refuse a
  non-loopback API base URL, which also covers subprocesses such as the Claude Code CLI.
- Every test runs under ``refuse_non_loopback()`` (sockets may reach only loopback addresses)
  unless it is marked ``@pytest.mark.allow_network``. A refusal that the code under test
  swallowed (turned into a connection error) still fails the test at teardown; the
  ``network_guard`` fixture gives a test the guard to inspect.
- The run builds what is expensive once for all its pytest-xdist workers, in a folder the
  controlling process makes and removes (``tests/session_shared.py``).
- ``pg_server`` is one throwaway PostgreSQL server for the whole run, shared by the workers and
  stopped by pid at the end (``tests/pg_server.py``); ``pg_url`` is a fresh database on it for
  one test, and ``store_url`` runs a test once per backend (a SQLite file, then a PostgreSQL
  database). ``own_pg_server`` is a server of the test's own, for tests that restart it;
  ``restartable_pg_server`` one per pytest-xdist worker for tests that stop and start it and
  leave it running (each on a database of its own), which saves the ``initdb`` per test.
  Without the binaries these skip, or fail under ``AGENTMEND_REQUIRE_SERVICES=1``.
- ``fake_api`` yields a started ``FakeMessagesAPI`` (``tests/fake_messages_api.py``) and closes
  it after the test. Test modules import the helpers with
  ``from fake_messages_api import Reply, FakeMessagesAPI`` (tests/ is on sys.path because this
  directory has no ``__init__.py``).
- ``manager`` is an ``ImprovementManager`` on a store of its own and ``monitor`` an in-memory
  ``PerformanceMonitor``; a module that needs other settings defines its own.
- ``restore_logging`` puts structlog's configuration back after a test that ran ``main()``
  (which configures logging onto the captured stderr, closed after the test); modules that
  run the command use it with ``pytestmark = pytest.mark.usefixtures("restore_logging")``.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog
from fake_messages_api import FakeMessagesAPI
from package_modules import modules_under_folder_names
from pg_server import PgServer, PgUnavailable, shared_pg_server, stop_shared_pg_server
from round_trips import PgRoundTrips
from services import unavailable
from session_shared import make_run_folder

from agentmend.infrastructure.changes.improvement_manager import ImprovementManager
from agentmend.infrastructure.llm.network_guard import (
    TESTING_ENV_VAR,
    NetworkGuard,
    refuse_non_loopback,
)
from agentmend.infrastructure.monitoring.performance_monitor import PerformanceMonitor
from agentmend.infrastructure.store.api import Store

_RUN_FOLDER = pytest.StashKey[Path]()


def pytest_configure(config: pytest.Config) -> None:
    os.environ.setdefault(TESTING_ENV_VAR, "1")
    if not hasattr(config, "workerinput"):  # the controlling process (or a run without xdist)
        config.stash[_RUN_FOLDER] = make_run_folder()


def pytest_unconfigure(config: pytest.Config) -> None:
    folder = config.stash.get(_RUN_FOLDER, None)
    if folder is not None:
        stop_shared_pg_server(folder)
        shutil.rmtree(folder, ignore_errors=True)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests marked slow run first (stable order otherwise): a worker that draws a long
    test late holds the whole run while the other workers sit idle; drawn first, the short tests
    fill in around it."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture(scope="session", autouse=True)
def no_module_under_a_folder_name() -> Iterator[None]:
    """After every test of this worker: nothing of ours was imported as ``agents.*`` or
    ``infrastructure.*`` (the folders' own names, importable from a checkout), only as
    ``agentmend.*``; a leak fails the run at its last test's teardown."""
    yield
    leaked = modules_under_folder_names()
    assert leaked == [], f"imported under a folder's name instead of agentmend: {leaked}"


@pytest.fixture(autouse=True)
def network_guard(request: pytest.FixtureRequest) -> Iterator[NetworkGuard | None]:
    """The active guard (None under ``allow_network``); a test that provokes a refusal on
    purpose clears ``network_guard.refused`` after checking it."""
    if request.node.get_closest_marker("allow_network") is not None:
        yield None
        return
    with refuse_non_loopback() as guard:
        yield guard
    if guard.refused:
        pytest.fail(f"the test tried to reach the network: {', '.join(guard.refused)}")


@pytest.fixture
def fake_api() -> Iterator[FakeMessagesAPI]:
    api = FakeMessagesAPI()
    try:
        yield api
    finally:
        api.close()


def _require_psycopg() -> None:
    try:
        import psycopg  # noqa: F401
    except ImportError:
        unavailable("psycopg is not installed (pip install agentmend[postgres])")


@pytest.fixture(scope="session")
def pg_server() -> PgServer:
    """The run's one server (stopped by the controlling process when the run ends)."""
    _require_psycopg()
    try:
        return shared_pg_server()
    except PgUnavailable as exc:
        unavailable(str(exc))


@pytest.fixture
def own_pg_server() -> Iterator[PgServer]:
    """A server of this test's own, which it may restart without disturbing other workers."""
    _require_psycopg()
    try:
        server = PgServer()
    except PgUnavailable as exc:
        unavailable(str(exc))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def restartable_pg_server() -> Iterator[PgServer]:
    """A server this worker's tests may stop and start again (never the run's shared one);
    each test that stops it starts it again before it ends, even when failing."""
    _require_psycopg()
    try:
        server = PgServer()
    except PgUnavailable as exc:
        unavailable(str(exc))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def counter() -> Iterator[PgRoundTrips]:
    """PostgreSQL round trips counted on every connection opened while the test runs (see
    ``round_trips.py``); open the stores after it."""
    counting = PgRoundTrips.install()
    try:
        yield counting
    finally:
        counting.uninstall()


@pytest.fixture
def pg_url(pg_server: PgServer) -> str:
    """A fresh database of its own for this test."""
    return pg_server.create_database()


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The test's store, once on each backend."""
    if request.param == "sqlite":
        return str(tmp_path / "agentmend.db")
    return str(request.getfixturevalue("pg_url"))


@pytest.fixture
def manager(tmp_path: Path) -> Iterator[ImprovementManager]:
    """An ``ImprovementManager`` on a store of its own (``<tmp>/ws/agentmend.db``)."""
    with ImprovementManager(store=Store(tmp_path / "ws" / "agentmend.db")) as opened:
        yield opened
        opened.store.close()


@pytest.fixture
def monitor() -> Iterator[PerformanceMonitor]:
    """An in-memory ``PerformanceMonitor`` with the default settings, closed after the test.

    A test module that needs other settings (a small window, a baseline size) defines its own
    ``monitor``, which takes precedence there."""
    with PerformanceMonitor() as opened:
        yield opened


@pytest.fixture
def restore_logging() -> Iterator[None]:
    saved = structlog.get_config()
    yield
    structlog.configure(**saved)
