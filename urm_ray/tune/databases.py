"""The databases behind a sweep (its Optuna storage and its MLflow tracking store), checked once
before Ray starts.

An SQLite file (the default for both) needs nothing. A PostgreSQL server
(``postgresql://user[:password]@host[:port]/database``, which SQLAlchemy 2.1 reaches through
psycopg 3) is connected to here with a short timeout, so that a wrong URL or a server that is
down fails at once with the URL (password hidden) and what was expected, instead of after
MLflow's own retries (about 100 s) with Ray already started. See docs/databases.md.
"""

from __future__ import annotations

import sqlalchemy
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, NoSuchModuleError
from sqlalchemy.pool import NullPool

from urm_ray.errors import ConfigError
from urm_ray.redact import redact

CONNECT_TIMEOUT_S = 5
DEFAULT_PORT = 5432


def check_reachable(url: str, role: str) -> None:
    """Connect to a PostgreSQL ``url`` once; raise ConfigError naming ``role`` (e.g. "the Optuna
    storage (--storage)") if it cannot be reached. Other URLs pass unchecked."""
    scheme = url.partition("://")[0].lower()
    if scheme == "postgres":  # Heroku's spelling; SQLAlchemy knows only postgresql://
        fixed = redact("postgresql" + url[len("postgres"):])
        raise ConfigError(f"{role}: SQLAlchemy reads no postgres:// URLs; write {fixed}")
    if scheme.partition("+")[0] != "postgresql":
        return
    parsed = make_url(url)
    try:
        engine = sqlalchemy.create_engine(parsed, poolclass=NullPool,
                                          connect_args={"connect_timeout": CONNECT_TIMEOUT_S})
    except (NoSuchModuleError, ImportError) as err:
        raise ConfigError(f"{role} {redact(url)}: no PostgreSQL driver for it ({err}); "
                          "urm_ray depends on psycopg 3: write postgresql:// or "
                          "postgresql+psycopg://") from None
    try:
        with engine.connect() as conn:
            conn.execute(sqlalchemy.text("SELECT 1"))
    except DBAPIError as err:
        reason = _reason(err)
        raise ConfigError(f"{role} {redact(url)} cannot be reached: {reason}; expected "
                          f"{_expected(parsed, reason)}") from None
    finally:
        engine.dispose()


def check_separate(optuna_url: str, tracking_uri: str) -> None:
    """Optuna and MLflow each record their schema's version in a table ``alembic_version``: in
    one database, the second to open it finds the other's version and stops."""
    if _identity(optuna_url) is not None and _identity(optuna_url) == _identity(tracking_uri):
        raise ConfigError(f"the Optuna storage and the MLflow tracking store are one database "
                          f"({redact(optuna_url)}); both keep a table alembic_version, so each "
                          "needs its own: create a second database (e.g. optuna and mlflow)")


def _identity(url: str) -> tuple | None:
    """(backend, host, port, database) of a database URL; None for other URIs (http://...)."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        return None
    host = parsed.host or parsed.query.get("host")
    return (parsed.get_backend_name(), host, parsed.port or parsed.query.get("port"), parsed.database)


def _expected(url: URL, reason: str) -> str:
    host, port = url.host or "localhost", url.port or DEFAULT_PORT
    expected = (f"a PostgreSQL server accepting connections on {host}:{port} and holding the "
                f"database {url.database!r}, open to the role {url.username or '(your login)'!r}")
    if "does not exist" in reason:
        user = f" -U {url.username}" if url.username else ""
        expected += f" (create the database: `createdb -h {host} -p {port}{user} {url.database}`)"
    return expected


def _reason(err: DBAPIError) -> str:
    """psycopg's message in one line (it spans lines: the failure, then a hint)."""
    return " ".join(line.strip() for line in str(err.orig).splitlines() if line.strip())
