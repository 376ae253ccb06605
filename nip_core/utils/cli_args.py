"""Argument parsing shared by the ``nipflow`` commands: one-line errors and checked values.

Bad input makes a command exit with status 2 and print one line on stderr that names the
option, never the usage block (``nipflow CMD --help`` shows it) nor a traceback. The type
functions below turn a bad value into such an argparse error at parse time, before
anything is started or written.
"""

from __future__ import annotations

import argparse
import os
import socket
import tempfile
from pathlib import Path

#: Host values that mean "every interface"; they need no name resolution.
WILDCARD_HOSTS = ("0.0.0.0", "::", "")


class ArgumentParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line, ``PROG: error: MESSAGE``, status 2.

    Sub-parsers made with ``add_subparsers().add_parser`` are of the same class, so their
    errors name the sub-command (``nipflow run: error: argument --device: ...``).
    """

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {' '.join(str(message).split())}\n")


def _integer(text: str, what: str) -> int:
    try:
        return int(text)
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None


def port(text: str) -> int:
    """A TCP port to listen on or connect to, 1 to 65535."""
    value = _integer(text, "a port number from 1 to 65535")
    if not 0 < value < 65536:
        raise argparse.ArgumentTypeError(f"expected a port number from 1 to 65535, got {value}")
    return value


def port_or_zero(text: str) -> int:
    """A TCP port to listen on, 1 to 65535, or 0: a free one."""
    value = _integer(text, "a port number from 0 (a free one) to 65535")
    if not 0 <= value < 65536:
        raise argparse.ArgumentTypeError(f"expected a port number from 0 (a free one) to 65535, got {value}")
    return value


def non_negative_int(text: str) -> int:
    """An integer >= 0."""
    value = _integer(text, "an integer >= 0")
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {value}")
    return value


def host(text: str) -> str:
    """A host name or address that resolves here (a wildcard such as 0.0.0.0 as it is)."""
    if text in WILDCARD_HOSTS:
        return text
    try:
        socket.getaddrinfo(text, None, proto=socket.IPPROTO_TCP)
    except (socket.gaierror, UnicodeError) as e:
        reason = getattr(e, "strerror", None) or str(e)
        raise argparse.ArgumentTypeError(f"{text!r} is not an address or a host name known here ({reason})") \
            from None
    return text


def directory_problem(path: str | os.PathLike, *, write: bool) -> str | None:
    """Why ``path`` cannot be used as a local directory (``None``: it can), creating nothing.

    It must not be, or lie below, something that is not a directory; with ``write`` a
    directory must be creatable there (or exist) and writable: a temporary directory is made
    and removed in its nearest existing ancestor (a check that holds for root too, and on
    read-only or virtual file systems such as /proc).
    """
    target = Path(path).absolute()
    existing = target
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return "is not a directory" if existing == target else f"lies below {existing}, which is not a directory"
    if write:
        try:
            os.rmdir(tempfile.mkdtemp(prefix=".nipflow-write-check-", dir=existing))
        except OSError as e:
            return f"cannot write in {existing} ({e.strerror or e})"
    return None
