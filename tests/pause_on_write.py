"""Test-only: run ``nipflow`` in a process that stops itself right after a chosen run-store write.

``python -m tests.pause_on_write PATTERN N -- ARGS...`` runs ``flows.cli.main(ARGS)`` with the
run store's write methods (:class:`nip_core.runs.storage.Storage` ``write_bytes``,
``create_exclusive`` when it created the file, ``append_line``) wrapped: right after the
``N``-th write whose path, relative to the run's directory, matches ``PATTERN`` (``fnmatch``;
``METHOD:PATTERN`` counts only the writes of that method — a takeover's seal copies the
mutable files with ``create_exclusive``, their driver's own writes are the other two),
the process sends itself ``SIGSTOP`` — every thread stops there, the lease's renewal thread
included, as in a long GC or swap pause, a VM migration or a closed laptop lid. It goes on
when it gets ``SIGCONT``. Production code knows nothing of this.

``call:MODULE:CLASS.METHOD`` (or ``call:MODULE:FUNCTION``) as ``PATTERN`` stops instead as the
``N``-th call of that function begins: a moment in the middle of computing or waiting, between
two writes, reached at the same point of the run whatever the machine's speed.
"""

from __future__ import annotations

import fnmatch
import os
import signal
import sys


def install_call(target: str, nth: int) -> None:
    import importlib

    module_name, _, qualname = target.partition(":")
    *owner_path, attr = qualname.split(".")
    owner = importlib.import_module(module_name)
    for part in owner_path:
        owner = getattr(owner, part)
    original = getattr(owner, attr)
    calls = [0]

    def stop_then_call(*args, **kwargs):
        calls[0] += 1
        if calls[0] == nth:
            os.kill(os.getpid(), signal.SIGSTOP)
        return original(*args, **kwargs)

    setattr(owner, attr, stop_then_call)


def install(pattern: str, nth: int) -> None:
    if pattern.startswith("call:"):
        install_call(pattern[len("call:"):], nth)
        return
    from nip_core.runs.storage import Storage

    seen = [0]
    method_wanted, _, path_pattern = pattern.rpartition(":")

    def after(name: str, rel: str) -> None:
        if fnmatch.fnmatch(rel, path_pattern) and method_wanted in ("", name):
            seen[0] += 1
            if seen[0] == nth:
                os.kill(os.getpid(), signal.SIGSTOP)

    def wrap(name: str, counts=lambda result: True):
        original = getattr(Storage, name)

        def method(self, rel, *args, **kwargs):
            result = original(self, rel, *args, **kwargs)
            if counts(result):
                after(name, rel)
            return result

        setattr(Storage, name, method)

    wrap("write_bytes")
    wrap("append_line")
    wrap("create_exclusive", counts=bool)


def main(argv: list[str]) -> int:
    pattern, nth, separator, *args = argv
    if separator != "--":
        raise SystemExit("usage: python -m tests.pause_on_write PATTERN N -- NIPFLOW_ARGS...")
    install(pattern, int(nth))
    from flows.cli import main as nipflow

    return nipflow(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
