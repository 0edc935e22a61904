"""The package version, read by the build backend and ``leaseworker --version``; the releases.

Pods of two releases may share a namespace (Redis keys, topics, the store)
when the newer one's ``runs_beside`` is not newer than the older one. A
release may name an earlier one there only if it reads that release's fence
keys and effect headers and that release's pods run on its store schema
(migrations added since are additive). A release that raises ``runs_beside``
brings a migration, even an empty one, because the store is where pods meet:
each migration records the release that applied it and the schema its
``runs_beside`` needs, and a pod whose schema is older refuses to start
(:func:`leaseworker._store._schema.refuse_newer`). Pods announce their
release nowhere else (not in Redis, not in the group's metadata), so the
store's schema is the one check, both ways: an older pod does not start, or
restart, on a schema a release it cannot run beside has migrated; and a
newer pod does not migrate a schema of a release it cannot run beside, whose
pods may still run (:func:`~leaseworker._store._schema.refuse_older`). Such
an upgrade is a full stop: stop the older pods, ``leaseworker store
migrate``, start the newer ones.
"""

from __future__ import annotations

from dataclasses import dataclass

__version__ = "0.2.0.dev0"


@dataclass(frozen=True, slots=True, kw_only=True)
class Release:
    """One release and what its pods put where other pods read it."""

    version: str
    schema: int
    """The store schema version its pods migrate to."""
    fence_keys: int
    """The fence key format it writes (2: ``"<fence> <note>"``, bare integers still read)."""
    effect_headers: int
    """The effect headers it writes (1: ``leaseworker-effect-id``, ``-job-key``, ``-fence``)."""
    runs_beside: str
    """The oldest release whose pods may share a namespace with this one's."""


RELEASES = (
    Release(version="0.1.0", schema=12, fence_keys=2, effect_headers=1, runs_beside="0.1.0"),
    Release(version="0.2.0", schema=13, fence_keys=2, effect_headers=1, runs_beside="0.1.0"),
)
"""Every release, oldest first; the last is the one this code becomes."""


def runs_beside_schema() -> int:
    """Return the store schema of the oldest release this one runs beside: what pods need."""
    oldest = RELEASES[-1].runs_beside
    return next(release.schema for release in RELEASES if release.version == oldest)
