"""A throwaway PostgreSQL server for tests and benchmarks: its own data folder, a free port on
127.0.0.1, trust authentication (or a password, as a shared server has: ``password=``), stopped
and removed when done.

    server = start_server()
    url = server.create_database("optuna")   # postgresql://postgres@127.0.0.1:<port>/optuna
    server.stop()

PostgreSQL refuses to run as root (``initdb`` says so and stops). When this process is root, as
in CI, ``initdb`` and the server run as the ``postgres`` system user instead (the Debian/Ubuntu
package creates it), in a temporary folder owned by that user: pytest's own temporary folders
sit under a folder only root may enter.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

SUPERUSER = "postgres"  # the database role initdb creates; trusted from 127.0.0.1
SYSTEM_USER = "postgres"  # who runs the server when this process is root
START_TIMEOUT_S = 30.0


def find_binaries() -> Path | None:
    """The folder holding ``initdb`` and ``postgres``: the newest Debian/Ubuntu install
    (/usr/lib/postgresql/<version>/bin, where they are not on PATH), else PATH; None if absent."""
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin"),
                      key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0)
    for folder in reversed(versions):
        if (folder / "initdb").is_file() and (folder / "postgres").is_file():
            return folder
    found = shutil.which("initdb")
    return Path(found).parent if found and shutil.which("postgres") else None


@dataclass
class PostgresServer:
    port: int
    folder: Path  # data/ (the cluster), server.log, the Unix socket
    process: subprocess.Popen
    host: str = "127.0.0.1"
    password: str = ""  # the superuser's (scram-sha-256); empty: trust authentication

    def url(self, database: str = "postgres") -> str:
        secret = f":{self.password}" if self.password else ""
        return f"postgresql://{SUPERUSER}{secret}@{self.host}:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        """A new, empty database; returns its URL."""
        import psycopg
        from psycopg import sql

        with psycopg.connect(self.url(), autocommit=True) as conn:  # not inside a transaction
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return self.url(name)

    def log(self) -> str:
        path = self.folder / "server.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        """Fast shutdown (SIGINT: sessions ended, data flushed), then the folder is removed."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        shutil.rmtree(self.folder, ignore_errors=True)


def start_server(durable: bool = False, max_connections: int = 200,
                 binaries: Path | None = None, password: str = "") -> PostgresServer:
    """Initialise a cluster in a new temporary folder and start a server on a free port; with a
    ``password``, every connection (local ones too) must give it (scram-sha-256).

    ``durable=False`` (tests) turns off fsync: the data is thrown away anyway. A benchmark keeps
    it on, as a real server has it. Raises RuntimeError with the server's log if it does not
    accept connections within ``START_TIMEOUT_S``.
    """
    binaries = binaries or find_binaries()
    if binaries is None:
        raise FileNotFoundError("PostgreSQL's initdb and postgres are not installed "
                                "(apt-get install postgresql)")
    folder = Path(tempfile.mkdtemp(prefix="urm-ray-postgres-"))
    as_user = unprivileged()
    if as_user:
        entry = pwd.getpwnam(SYSTEM_USER)
        os.chown(folder, entry.pw_uid, entry.pw_gid)
    try:
        auth = ["--auth=trust"]
        if password:
            secret = folder / "pwfile"
            secret.write_text(password + "\n")
            if as_user:
                os.chown(secret, pwd.getpwnam(SYSTEM_USER).pw_uid, -1)
            auth = ["--auth=scram-sha-256", f"--pwfile={secret}"]
        _run([str(binaries / "initdb"), "-D", str(folder / "data"), "-U", SUPERUSER, *auth,
              "--encoding=UTF8", "--locale=C", "--no-sync"], as_user)
        (folder / "pwfile").unlink(missing_ok=True)
        for _ in range(3):  # another process may take the free port before the server binds it
            server = _launch(binaries, folder, free_port(), durable, max_connections, as_user)
            server.password = password
            if _wait_ready(server):
                return server
            if server.process.poll() is None:
                os.killpg(server.process.pid, signal.SIGKILL)
            server.process.wait()
            if "could not bind" not in server.log():
                break
        raise RuntimeError(f"PostgreSQL did not start on port {server.port}:\n{server.log()[-3000:]}")
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise


def unprivileged() -> dict[str, object]:
    """Popen arguments that run a command as the ``postgres`` user when this process is root."""
    if os.geteuid() != 0:
        return {}
    try:
        pwd.getpwnam(SYSTEM_USER)
    except KeyError:
        raise RuntimeError(f"running as root, PostgreSQL needs a non-root system user "
                           f"{SYSTEM_USER!r} to run as; none exists (useradd --system postgres)") from None
    return {"user": SYSTEM_USER, "group": SYSTEM_USER, "extra_groups": []}


def _run(cmd: list[str], as_user: dict[str, object]) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True, **as_user)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stdout}{done.stderr}")


def _launch(binaries: Path, folder: Path, port: int, durable: bool, max_connections: int,
            as_user: dict[str, object]) -> PostgresServer:
    settings = {"listen_addresses": "127.0.0.1", "port": port, "unix_socket_directories": folder,
                "max_connections": max_connections, "fsync": "on" if durable else "off"}
    if not durable:
        settings.update(synchronous_commit="off", full_page_writes="off")
    args = [a for key, value in settings.items() for a in ("-c", f"{key}={value}")]
    log = open(folder / "server.log", "wb")  # noqa: SIM115 - the server holds it until it stops
    # its own session: a Ctrl-C meant for pytest does not reach the server before stop() does
    process = subprocess.Popen([str(binaries / "postgres"), "-D", str(folder / "data"), *args],
                               stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                               **as_user)
    log.close()
    return PostgresServer(port, folder, process)


def _wait_ready(server: PostgresServer) -> bool:
    import psycopg

    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline and server.process.poll() is None:
        try:
            psycopg.connect(server.url(), connect_timeout=2).close()
            return True
        except psycopg.OperationalError:
            time.sleep(0.1)
    return False


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
