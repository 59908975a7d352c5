"""Where Krishiv stages a table's batches: ``<parent of the table location>/_krishiv_staging/<table folder>``.

Staged files live beside the table's location, never inside it: Iceberg's standard orphan-file removal
(``RemoveOrphanFiles``, Spark's ``remove_orphan_files``) lists the table location and deletes what no snapshot
references, which is every file of a PENDING entry. The relay registers the files where they are. The stager
(``spark_jobs.staging``) writes there and Krishiv's own orphan removal (``outbox.orphans``) lists there, so both
take the folder from here.
"""

from __future__ import annotations

import re

STAGING_DIR = "_krishiv_staging"
_BUCKET_ROOT = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:/$")  # the parent of scheme://bucket


def staging_root_of(location: str) -> str | None:
    """The staging folder of a table at ``location`` (a path or a URI), or None for a table at the very root of a
    bucket, which has no folder beside it to stage in."""
    parent, _, name = location.rstrip("/").rpartition("/")
    return None if _BUCKET_ROOT.match(parent) else f"{parent}/{STAGING_DIR}/{name}"
