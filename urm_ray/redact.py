"""Secrets out of every record: passwords in URLs never reach a terminal, a log, an error, MLflow or
a file this package writes.

A tracking URI, an Optuna storage or a storage path may carry a password
(``postgresql://user:secret@host/db``, ``https://user:token@mlflow.example``,
``s3://KEY:SECRET@bucket``) or a secret query parameter (``?password=...``). Two functions, built
on the same patterns:

- ``redact(text)`` for what a person reads (log lines, errors, the terminal): each secret becomes
  ``***``, so the reader sees that one was there;
- ``strip(value)`` for what is recorded (MLflow params and tags, ``config.yaml``, ``sweep.json``):
  each secret is removed, so the recorded URL still works where the password comes from the
  environment (``PGPASSWORD`` or ``~/.pgpass`` for PostgreSQL, ``MLFLOW_TRACKING_USERNAME`` /
  ``MLFLOW_TRACKING_PASSWORD`` for an MLflow server, the AWS variables for S3). It walks dicts and
  lists, so a whole config goes through it.

``redacting_output`` does the same for what a command prints (its own lines, Ray's copies of its
workers' output, a library's warning). ``remember`` and ``recall`` give a process back the password that its records do not hold: a URL
with its password, from the environment or the command line, is remembered in this process's
memory (never in a file or a variable other processes see), and a recorded URL (``strip``-ped) is
recalled as that URL where it is used: a resumed sweep's storage, a searcher that Tune saved to
disk and reads back. ``install`` makes every
log record of the process pass through ``redact`` (called when ``urm_ray`` is imported, so Ray
workers and trial actors get it too).
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TextIO

MASK = "***"
# scheme://user:password@  (the password ends at the first '@'; a '/' in it must be %-encoded)
_USERINFO = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.\-]*://[^:/@\s]*):(?P<secret>[^@\s/]*)@")
_SECRET_KEYS = ("password", "passwd", "pwd", "sslpassword", "secret", "secret_key", "token",
                "access_token", "aws_secret_access_key", "x-amz-signature", "x-amz-credential",
                "x-amz-security-token")
# key=value in a URL query (?k=v&...) or a libpq conninfo string (k=v k=v)
_PARAM = re.compile(r"(?P<sep>[?&;\s]|^)(?P<key>" + "|".join(map(re.escape, _SECRET_KEYS))
                    + r")=(?P<secret>[^&;\s#'\"]*)", re.IGNORECASE)


def redact(text: str) -> str:
    """``text`` with every password of a URL and every secret parameter replaced by ``***``."""
    if "=" not in text and "@" not in text:
        return text  # the common case, kept cheap: every log record passes through here
    text = _USERINFO.sub(lambda m: f"{m['head']}:{MASK}@", text)
    return _PARAM.sub(lambda m: f"{m['sep']}{m['key']}={MASK}", text)


def strip(value: Any) -> Any:
    """``value`` with every secret removed: a string, or dicts and lists of them (other values
    unchanged). A URL keeps its user name; its password comes from the environment instead."""
    if isinstance(value, str):
        return _strip_text(value)
    if isinstance(value, dict):
        return {key: strip(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(strip(item) for item in value)
    return value


def _strip_text(text: str) -> str:
    if "=" not in text and "@" not in text:
        return text
    text = _USERINFO.sub(lambda m: f"{m['head']}@" if not m["head"].endswith("://") else m["head"], text)
    text = _PARAM.sub(lambda m: m["sep"] if m["sep"] in "?" else "", text)
    return text.replace("?&", "?").rstrip("?")


_remembered: dict[str, str] = {}  # stripped URL -> the URL with its secret, this process only


def remember(url: str) -> None:
    """Keep ``url``'s secret in this process, for ``recall`` of its stripped form."""
    clean = _strip_text(url)
    if clean != url:
        _remembered[clean] = url


def recall(url: str) -> str:
    """The URL to connect with: a remembered URL whose stripped form is ``url``, else ``url``."""
    return _remembered.get(url, url)


class _Redacting(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except (TypeError, ValueError):  # a malformed call: the handler reports it, as without us
            return True
        clean = redact(message)
        if clean != message:
            record.msg, record.args = clean, ()
        return True


def install() -> None:
    """Every log record created in this process from now on is redacted, whichever logger and
    handler it goes to (a record factory: handler filters would miss handlers added later)."""
    previous = logging.getLogRecordFactory()
    if getattr(previous, "urm_ray_redacts", False):
        return
    check = _Redacting()

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        check.filter(record)
        return record

    factory.urm_ray_redacts = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(factory)


class _RedactingStream:
    """A text stream that passes every write through ``redact`` (everything else: the stream's)."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        self._stream.write(redact(text))
        return len(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextmanager
def redacting_output() -> Iterator[None]:
    """``sys.stdout`` and ``sys.stderr`` redacted while held (a command's whole run)."""
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _RedactingStream(saved[0]), _RedactingStream(saved[1])
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved
