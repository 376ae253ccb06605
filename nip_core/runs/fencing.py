"""Fenced mutable files: a driver that lost the run's lease cannot change what readers see.

The run store has two kinds of files. Files written once (rollouts, transcripts, models
records, stage summaries, checkpoint data and manifests) are created exclusively
(:meth:`Storage.create_exclusive`): an existing one is never replaced. The few files that a
run rewrites as it goes — :data:`MUTABLE_FILES` and the records in :data:`MUTABLE_DIRS` —
cannot be created once, and a check of the lease before each write cannot fence them: a
driver paused between its check and its write (a GC or swap pause, ``SIGSTOP``, a VM
migration, a laptop lid) writes after another driver took the run over.

So mutable files are **tagged with an epoch**. An epoch is the lease generation of the
last *takeover* (a claim over a holder that never released its lease); a claim after a
clean release keeps the epoch it finds (:mod:`nip_core.runs.lease` stores it in every
claim). Epoch 0 is the plain name (``state.json``): a run that was never taken over looks
exactly as before. In epoch ``e > 0`` a mutable file ``dir/name.ext`` is written as
``dir/name.g<e:010d>.ext``, and **readers take the newest epoch present** (a driver reads
the newest at or below its own epoch).

Before a contender claims generation ``g`` over a holder that did not release, it *seals*
every mutable file: it copies the newest version into epoch ``g`` with an exclusive create
(:func:`seal`; a copy another contender made first is kept). Only then does it create the
claim. Why this is safe for a holder paused at *any* instruction:

* the old holder writes only to its own epoch's names, which are below ``g``; every file
  that existed when the seal ran has a version at ``g``, which hides any later write of
  the old holder, whatever it is;
* a write of the old holder that landed before the seal copied that file is in the copy:
  it happened before the takeover (the contender had not claimed yet);
* the seal's copies are created exclusively, so a contender that loses the claim race, or
  is itself paused during its seal and wakes late, never replaces anything;
* a file that did not exist at the seal and that the old holder creates afterwards is
  visible like any write-once file created by it (and refused to a second writer with
  other bytes); the old holder stops at its next lease check.
"""

from __future__ import annotations

import posixpath
import re

from nip_core.runs.storage import Storage

#: Files a run rewrites in place (relative to the run's directory).
MUTABLE_FILES = ("state.json", "metadata.json", "metrics.jsonl", "orchestration/suspensions.json")
#: Folders whose every file is rewritten in place (the fine-tune records of each group).
MUTABLE_DIRS = ("fine_tune",)

_TAGGED = re.compile(r"^(?P<stem>.+)\.g(?P<epoch>\d{10})(?P<ext>\.[A-Za-z0-9]+)$")


def is_mutable(rel: str) -> bool:
    """Whether ``rel`` is a mutable, epoch-tagged file of a run."""
    return rel in MUTABLE_FILES or posixpath.dirname(rel) in MUTABLE_DIRS


def tagged(rel: str, epoch: int) -> str:
    """The name of ``rel`` in ``epoch`` (``rel`` itself in epoch 0)."""
    if epoch <= 0:
        return rel
    directory, name = posixpath.split(rel)
    stem, ext = posixpath.splitext(name)
    return posixpath.join(directory, f"{stem}.g{epoch:010d}{ext}")


def untagged(name: str) -> tuple[str, int]:
    """``(logical name, epoch)`` of a file name (epoch 0 for a plain name)."""
    m = _TAGGED.match(name)
    if m is None:
        return name, 0
    return m.group("stem") + m.group("ext"), int(m.group("epoch"))


def versions(storage: Storage, rel: str) -> dict[int, str]:
    """Every stored version of the mutable file ``rel``: epoch -> stored name (relative)."""
    directory, name = posixpath.split(rel)
    found = {}
    for entry in storage.listdir(directory):
        logical, epoch = untagged(entry)
        if logical == name:
            found[epoch] = posixpath.join(directory, entry)
    return found


def resolve(storage: Storage, rel: str, epoch: int | None = None) -> str | None:
    """The stored name of ``rel``'s newest version (at or below ``epoch``), or None if none."""
    found = versions(storage, rel)
    usable = [e for e in found if epoch is None or e <= epoch]
    return found[max(usable)] if usable else None


def logical_names(storage: Storage, directory: str) -> list[str]:
    """The names of a mutable folder's files without their epoch tags, sorted."""
    return sorted({untagged(entry)[0] for entry in storage.listdir(directory)})


def present(storage: Storage) -> list[str]:
    """The mutable files the run has (logical names relative to the run's directory)."""
    rels = []
    for directory in sorted({posixpath.dirname(r) for r in MUTABLE_FILES} | set(MUTABLE_DIRS)):
        for name in logical_names(storage, directory):
            rel = posixpath.join(directory, name)
            if is_mutable(rel):
                rels.append(rel)
    return rels


def seal(storage: Storage, epoch: int) -> list[str]:
    """Copy the newest version of every mutable file into ``epoch`` (exclusive creates).

    Returns the files copied by this call. Run by a contender *before* it claims
    generation ``epoch`` over a holder that did not release (see the module's text).
    """
    sealed = []
    for rel in present(storage):
        source = resolve(storage, rel)
        if source is None or source == tagged(rel, epoch):
            continue
        try:
            data = storage.read_bytes(source)
        except FileNotFoundError:
            continue
        if storage.create_exclusive(tagged(rel, epoch), data):
            sealed.append(rel)
    return sealed


def current_file(run_location: str, rel: str) -> str:
    """The path (or URL) of the version of ``rel`` a reader of the run at ``run_location`` reads.

    For tools and notebooks that open a run's files directly: after a takeover, ``state.json``
    may be stored as ``state.g0000000003.json``. A file that is not mutable, or that does not
    exist, is named as it is.
    """
    storage = Storage(run_location)
    name = resolve(storage, rel) if is_mutable(rel) else None
    return storage.url(name or rel)
