"""Working folders a command may wipe: only the ones it made itself, recognised by a marker file.

``krishiv demo --state DIR`` and ``make bench`` (``python -m benchmarks --out DIR``) start from an empty working
folder. Before they delete anything in it, :func:`check_folder` makes sure the folder is missing, empty, or carries the
command's marker (written by :func:`reset_folder` when the command made it). Anything else (the real
ledger and warehouse, a home directory, a file) is refused with one line and nothing is deleted.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from krishiv_core.errors import KrishivError
from krishiv_core.runbook import runbook

DEMO_MARKER = ".krishiv-demo-state"
BENCH_MARKER = ".krishiv-bench-state"
#: The way out of every refusal here.
NAME_ANOTHER = "name a new or empty folder " + runbook("Files a command will not delete")


class FolderNotOurs(KrishivError):
    """A command was asked to wipe a folder it did not make; the message names the option and the folder."""


def check_folder(folder: Path, marker: str, *, command: str, label: str, what: str = "the folder") -> None:
    """Raise :class:`FolderNotOurs` unless ``folder`` is missing, empty, or carries ``marker``.

    ``label`` is how the user named the folder (``--state state``), ``what`` how the message calls it,
    ``command`` the command that writes the marker (``krishiv demo``). Reads only: nothing is created or
    deleted.
    """
    if folder.is_symlink():
        raise FolderNotOurs(f"{label}: {what} is a symbolic link; {NAME_ANOTHER}")
    if not folder.exists():
        above = next((parent for parent in folder.parents if parent.exists()), None)
        if above is not None and not above.is_dir():
            raise FolderNotOurs(f"{label}: {above} is a file, not a folder; {NAME_ANOTHER}")
        return
    if not folder.is_dir():
        raise FolderNotOurs(f"{label}: {what} is a file, not a folder; {NAME_ANOTHER}")
    mark = folder / marker
    if mark.is_file() and not mark.is_symlink():
        return
    if next(folder.iterdir(), None) is None:
        return
    raise FolderNotOurs(f"{label}: {what} exists and was not made by {command} (no {marker} in it); {NAME_ANOTHER}")


def reset_folder(folder: Path, marker: str, *, command: str, label: str, what: str = "the folder") -> None:
    """Make ``folder`` an empty folder carrying ``marker``, after :func:`check_folder` allows it.

    The marker is written first and the other entries deleted after it, so a folder left half-emptied by
    an interruption still carries the marker and the next run may empty it.
    """
    check_folder(folder, marker, command=command, label=label, what=what)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / marker).write_text(f"made by {command}; {command} deletes everything in this folder when it runs\n")
    for entry in list(folder.iterdir()):
        if entry.name == marker:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
