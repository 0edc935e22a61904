"""The store's schema as an ordered list of versioned migrations, one per dialect.

The job keys' heads and completions are here; the outbox's migrations are in
:mod:`._outbox_schema`; :data:`MIGRATIONS` puts both in version order.

Each adapter applies :data:`MIGRATIONS` at start under a lock only one starter
can hold, so pods starting at once migrate once; migrations stay additive for
rolling upgrades. Tables and locking: see docs/design.md#schema-and-migrations.
"""

from __future__ import annotations

from collections.abc import Sequence

from .._errors import ConfigError
from .._version import RELEASES, __version__, runs_beside_schema
from ._migration import Migration
from ._outbox_schema import OUTBOX_MIGRATIONS

VERSION_TABLE = "leaseworker_schema_version"

ADVISORY_LOCK_KEY = 0x6C77_5F73_6368_656D  # "lw_schem": serialises migrations on PostgreSQL
"""Key of the ``pg_advisory_xact_lock`` taken while migrating (per database)."""


_COMPLETE_HEAD = """
            CREATE OR REPLACE FUNCTION leaseworker_complete(
                p_job_key text, p_input_version text, p_fence bigint, p_result jsonb,
                p_execution_id text, p_pod text
            ) RETURNS TABLE (
                o_status text, o_winning_fence bigint, o_input_version text,
                o_fence bigint, o_result jsonb, o_execution_id text, o_pod text,
                o_completed_at timestamptz
            ) LANGUAGE plpgsql AS $fn$
            DECLARE
                head_fence bigint;
                head_version text;
"""
"""How ``leaseworker_complete`` begins in migrations 2 and 3: its signature, its head-row locals."""


_ACCEPT = """
                UPDATE leaseworker_jobs
                SET fence = p_fence, input_version = p_input_version, updated_at = now()
                WHERE job_key = p_job_key;
                RETURN QUERY
                    INSERT INTO leaseworker_completions AS c
                        (job_key, input_version, fence, result, execution_id, pod,
                         completed_at)
                    VALUES (p_job_key, p_input_version, p_fence, p_result,
                            p_execution_id, p_pod, now())
                    RETURNING 'accepted'::text, p_fence, c.input_version, c.fence,
                              c.result, c.execution_id, c.pod, c.completed_at;
            END
            $fn$
            """
"""The end ``leaseworker_complete`` has in migrations 2 and 3: accept, write, answer.

Migration 3 changed only what is stale; the text is shared so the two cannot drift.
"""


_CALLS = """
            CREATE OR REPLACE FUNCTION leaseworker_calls(p_calls jsonb)
            RETURNS TABLE (
                o_call integer, o_status text, o_seen_fence bigint, o_input_version text,
                o_fence bigint, o_result jsonb, o_execution_id text, o_pod text,
                o_completed_at timestamptz
            ) LANGUAGE plpgsql AS $fn$
            DECLARE
                i integer;
                c jsonb;
            BEGIN
                FOR i, c IN
                    SELECT e.n::integer, e.v FROM jsonb_array_elements(p_calls)
                        WITH ORDINALITY AS e(v, n)
                    ORDER BY e.v->>1, e.n
                LOOP
                    IF c->>0 = 'complete' THEN
                        RETURN QUERY SELECT i, r.* FROM leaseworker_complete(
                            c->>1, c->>2, (c->>3)::bigint, c->6, c->>4, c->>5{cost}) AS r;
                    ELSIF c->>0 = 'claim' THEN
                        RETURN QUERY SELECT i, r.* FROM leaseworker_claim(
                            c->>1, c->>2, (c->>3)::bigint) AS r;
                    ELSE
                        RETURN QUERY SELECT i, 'found'::text, f.fence, f.input_version,
                               f.fence, f.result, f.execution_id, f.pod, f.completed_at
                        FROM leaseworker_completions f
                        WHERE f.job_key = c->>1 AND f.input_version = c->>2;
                    END IF;
                END LOOP;
            END
            $fn$
            """
"""``leaseworker_calls()`` of migrations 4 and 12; ``{cost}``: what its completions pass on."""


def _without_rowid(table: str, columns: str, names: str) -> tuple[str, ...]:
    """Return the SQLite statements that rebuild ``table`` as ``WITHOUT ROWID``, rows kept."""
    return (
        f"CREATE TABLE {table}_new ({columns}) WITHOUT ROWID",
        f"INSERT INTO {table}_new ({names}) SELECT {names} FROM {table}",
        f"DROP TABLE {table}",
        f"ALTER TABLE {table}_new RENAME TO {table}",
    )


_JOBS: tuple[Migration, ...] = (
    Migration(
        version=1,
        description="completions per identity, highest accepted fence per job key",
        postgresql=(
            """
            CREATE TABLE leaseworker_jobs (
                job_key       text PRIMARY KEY,
                fence         bigint NOT NULL,
                input_version text NOT NULL,
                updated_at    timestamptz NOT NULL
            )
            """,
            """
            CREATE TABLE leaseworker_completions (
                job_key       text NOT NULL,
                input_version text NOT NULL,
                fence         bigint NOT NULL,
                result        jsonb NOT NULL,
                execution_id  text NOT NULL,
                pod           text NOT NULL,
                completed_at  timestamptz NOT NULL,
                PRIMARY KEY (job_key, input_version)
            )
            """,
        ),
        sqlite=(
            """
            CREATE TABLE leaseworker_jobs (
                job_key       TEXT PRIMARY KEY NOT NULL,
                fence         INTEGER NOT NULL,
                input_version TEXT NOT NULL,
                updated_at    INTEGER NOT NULL
            )
            """,
            """
            CREATE TABLE leaseworker_completions (
                job_key       TEXT NOT NULL,
                input_version TEXT NOT NULL,
                fence         INTEGER NOT NULL,
                result        TEXT NOT NULL,
                execution_id  TEXT NOT NULL,
                pod           TEXT NOT NULL,
                completed_at  INTEGER NOT NULL,
                PRIMARY KEY (job_key, input_version)
            )
            """,
        ),
    ),
    Migration(
        version=2,
        description="leaseworker_complete(): a fenced completion in one round trip",
        postgresql=(
            # The rule of _model.decide, run where the rows are. Called in its
            # own (autocommit) transaction, so it commits or rolls back whole.
            # READ COMMITTED gives each statement a fresh snapshot, so the reads
            # after the head row's lock see what earlier holders committed.
            _COMPLETE_HEAD
            + """            BEGIN
                -- Create the head row (sentinel fence -1, overwritten below
                -- before anyone can see it) or lock the existing one.
                INSERT INTO leaseworker_jobs AS j (job_key, fence, input_version, updated_at)
                VALUES (p_job_key, -1, '', now())
                ON CONFLICT (job_key) DO UPDATE SET job_key = j.job_key
                RETURNING j.fence, j.input_version INTO head_fence, head_version;
                RETURN QUERY
                    SELECT 'duplicate'::text, head_fence, c.input_version, c.fence,
                           c.result, c.execution_id, c.pod, c.completed_at
                    FROM leaseworker_completions c
                    WHERE c.job_key = p_job_key AND c.input_version = p_input_version;
                IF FOUND THEN
                    RETURN;
                END IF;
                IF p_fence < head_fence THEN
                    RETURN QUERY
                        SELECT 'stale'::text, head_fence, c.input_version, c.fence,
                               c.result, c.execution_id, c.pod, c.completed_at
                        FROM leaseworker_completions c
                        WHERE c.job_key = p_job_key AND c.input_version = head_version;
                    RETURN;
                END IF;"""
            + _ACCEPT,
        ),
        sqlite=(),  # SQLite states the rule in the store's own statements
    ),
    Migration(
        version=3,
        description="claimed fence per job key: a takeover makes lower fences stale at once",
        postgresql=(
            # -1 (NO_FENCE): no claim yet. A claim-only head row holds fence -1
            # and input version '' until a completion moves it.
            "ALTER TABLE leaseworker_jobs ADD COLUMN claimed_fence bigint NOT NULL DEFAULT -1",
            # Version 2's function with one change: stale below the highest
            # fence seen, accepted or claimed; a stale answer may find no
            # completion to show (LEFT JOIN: still one row).
            _COMPLETE_HEAD
            + """                seen bigint;
            BEGIN
                INSERT INTO leaseworker_jobs AS j (job_key, fence, input_version, updated_at)
                VALUES (p_job_key, -1, '', now())
                ON CONFLICT (job_key) DO UPDATE SET job_key = j.job_key
                RETURNING j.fence, j.input_version, greatest(j.fence, j.claimed_fence)
                INTO head_fence, head_version, seen;
                RETURN QUERY
                    SELECT 'duplicate'::text, seen, c.input_version, c.fence,
                           c.result, c.execution_id, c.pod, c.completed_at
                    FROM leaseworker_completions c
                    WHERE c.job_key = p_job_key AND c.input_version = p_input_version;
                IF FOUND THEN
                    RETURN;
                END IF;
                IF p_fence < seen THEN
                    RETURN QUERY
                        SELECT 'stale'::text, seen, c.input_version, c.fence,
                               c.result, c.execution_id, c.pod, c.completed_at
                        FROM (SELECT 1) AS one
                        LEFT JOIN leaseworker_completions c
                          ON c.job_key = p_job_key AND c.input_version = head_version
                         AND head_fence >= 0;
                    RETURN;
                END IF;"""
            + _ACCEPT,
            # The claim: raise the claimed fence under the head row's lock,
            # then look the identity up in a statement of its own (a fresh
            # READ COMMITTED snapshot, so it sees what the lock's earlier
            # holders committed). Always one row.
            """
            CREATE OR REPLACE FUNCTION leaseworker_claim(
                p_job_key text, p_input_version text, p_fence bigint
            ) RETURNS TABLE (
                o_status text, o_highest_fence bigint, o_input_version text,
                o_fence bigint, o_result jsonb, o_execution_id text, o_pod text,
                o_completed_at timestamptz
            ) LANGUAGE plpgsql AS $fn$
            DECLARE
                seen bigint;
            BEGIN
                -- p_fence < max(head, old claim) iff p_fence < max(head, new claim)
                INSERT INTO leaseworker_jobs AS j
                    (job_key, fence, input_version, updated_at, claimed_fence)
                VALUES (p_job_key, -1, '', now(), p_fence)
                ON CONFLICT (job_key) DO UPDATE
                SET claimed_fence = greatest(j.claimed_fence, EXCLUDED.claimed_fence)
                RETURNING greatest(j.fence, j.claimed_fence) INTO seen;
                RETURN QUERY
                    SELECT CASE WHEN c.job_key IS NOT NULL THEN 'duplicate'
                                WHEN p_fence < seen THEN 'stale'
                                ELSE 'claimed' END,
                           seen, c.input_version, c.fence, c.result,
                           c.execution_id, c.pod, c.completed_at
                    FROM (SELECT 1) AS one
                    LEFT JOIN leaseworker_completions c
                      ON c.job_key = p_job_key AND c.input_version = p_input_version;
            END
            $fn$
            """,
        ),
        sqlite=(
            "ALTER TABLE leaseworker_jobs ADD COLUMN claimed_fence INTEGER NOT NULL DEFAULT -1",
        ),
    ),
    Migration(
        version=4,
        description="leaseworker_calls(): a batch of lookups, claims and completions in one trip",
        postgresql=(
            # Calls that waited together, in one statement and one transaction:
            # each claim and completion is version 3's function itself, so the
            # rule and its read-after-lock order are unchanged (a VOLATILE
            # function's statements take fresh READ COMMITTED snapshots). Head
            # rows are locked in job key order, the same in every pod, so two
            # batches never deadlock; calls of one job key keep their order.
            # p_calls is a JSON array of [kind, job key, input version, fence,
            # execution id, pod, result]: one parameter, cheap for the client to
            # build. A lookup only reads: one row if the identity completed.
            _CALLS.replace("{cost}", ""),
        ),
        sqlite=(),  # SQLite batches its calls in the store (group commit)
    ),
    Migration(
        version=8,
        description="SQLite: head and completion rows in their key's b-tree; a trigger moves heads",
        postgresql=(),  # PostgreSQL's leaseworker_complete moves the head itself
        sqlite=(
            # WITHOUT ROWID: a row lives in its primary key's b-tree, so a write
            # touches one b-tree, not a table and its key's index (less WAL per
            # commit). Rebuilt under the migration's write lock, rows kept.
            *_without_rowid(
                "leaseworker_jobs",
                "job_key TEXT PRIMARY KEY NOT NULL, fence INTEGER NOT NULL,"
                " input_version TEXT NOT NULL, updated_at INTEGER NOT NULL,"
                " claimed_fence INTEGER NOT NULL DEFAULT -1",
                "job_key, fence, input_version, updated_at, claimed_fence",
            ),
            *_without_rowid(
                "leaseworker_completions",
                "job_key TEXT NOT NULL, input_version TEXT NOT NULL, fence INTEGER NOT NULL,"
                " result TEXT NOT NULL, execution_id TEXT NOT NULL, pod TEXT NOT NULL,"
                " completed_at INTEGER NOT NULL, PRIMARY KEY (job_key, input_version)",
                "job_key, input_version, fence, result, execution_id, pod, completed_at",
            ),
            # A recorded completion moves its job key's head in the same
            # statement: a completion is one statement. Code of version 7,
            # which moves the head itself, writes the same values again.
            """
            CREATE TRIGGER leaseworker_move_head AFTER INSERT ON leaseworker_completions
            BEGIN
                INSERT INTO leaseworker_jobs (job_key, fence, input_version, updated_at)
                VALUES (NEW.job_key, NEW.fence, NEW.input_version, NEW.completed_at)
                ON CONFLICT (job_key) DO UPDATE SET
                    fence = excluded.fence,
                    input_version = excluded.input_version,
                    updated_at = excluded.updated_at;
            END
            """,
        ),
    ),
    Migration(
        version=12,
        description="what an execution's run_in_process children cost, kept with its completion",
        postgresql=(
            # Nullable, no default: a catalog-only change; completions of
            # earlier code, and of executions that ran no child, keep NULL.
            "ALTER TABLE leaseworker_completions"
            " ADD COLUMN cpu_seconds double precision, ADD COLUMN peak_memory bigint",
            # A second leaseworker_complete (two more arguments) around the
            # first: the rule stays in one function, and pods of earlier code
            # keep calling the six-argument one. The cost is written by its
            # own UPDATE in the same transaction, only when there is one:
            # the row this execution just recorded (or had recorded, on a
            # retried commit), never another execution's.
            """
            CREATE OR REPLACE FUNCTION leaseworker_complete(
                p_job_key text, p_input_version text, p_fence bigint, p_result jsonb,
                p_execution_id text, p_pod text,
                p_cpu_seconds double precision, p_peak_memory bigint
            ) RETURNS TABLE (
                o_status text, o_winning_fence bigint, o_input_version text,
                o_fence bigint, o_result jsonb, o_execution_id text, o_pod text,
                o_completed_at timestamptz
            ) LANGUAGE plpgsql AS $fn$
            BEGIN
                RETURN QUERY SELECT * FROM leaseworker_complete(
                    p_job_key, p_input_version, p_fence, p_result, p_execution_id, p_pod);
                IF p_cpu_seconds IS NOT NULL OR p_peak_memory IS NOT NULL THEN
                    UPDATE leaseworker_completions
                    SET cpu_seconds = p_cpu_seconds, peak_memory = p_peak_memory
                    WHERE job_key = p_job_key AND input_version = p_input_version
                      AND execution_id = p_execution_id AND fence = p_fence;
                END IF;
            END
            $fn$
            """,
            # A completion's entry may carry the cost as its elements 7 and 8
            # (missing from earlier code's entries: NULL).
            _CALLS.replace("{cost}", ", (c->>7)::double precision, (c->>8)::bigint"),
        ),
        sqlite=(
            "ALTER TABLE leaseworker_completions ADD COLUMN cpu_seconds REAL",
            "ALTER TABLE leaseworker_completions ADD COLUMN peak_memory INTEGER",
        ),
    ),
    Migration(
        version=13,
        description="each version row names the release that applied it and the schema it needs",
        postgresql=(
            # Nullable: earlier code inserts its rows without them (and had
            # no mark to leave: 0.1.0 runs beside itself only).
            f"ALTER TABLE {VERSION_TABLE} ADD COLUMN release text, ADD COLUMN runs_beside integer",
        ),
        sqlite=(
            f"ALTER TABLE {VERSION_TABLE} ADD COLUMN release TEXT",
            f"ALTER TABLE {VERSION_TABLE} ADD COLUMN runs_beside INTEGER",
        ),
    ),
)
"""Migrations of the heads, the completions and ``leaseworker_complete``."""

MARKED_FROM = 13
"""The first migration whose version row carries ``release`` and ``runs_beside``."""

MARK = f"UPDATE {VERSION_TABLE} SET release = {{0}}, runs_beside = {{0}} WHERE version = {{0}}"
"""Marks a version row applied by this code (``{0}``: the dialect's placeholder)."""

MARKS_ABOVE = (
    f"SELECT version, release, (SELECT max(runs_beside) FROM {VERSION_TABLE} WHERE version > {{0}})"
    f" FROM {VERSION_TABLE} WHERE version > {{0}} ORDER BY version DESC LIMIT 1"
)
"""Reads the marks above this code's latest version, given twice (``{0}``: the placeholder)."""

MIGRATIONS: tuple[Migration, ...] = tuple(
    sorted((*_JOBS, *OUTBOX_MIGRATIONS), key=lambda migration: migration.version)
)
"""Every migration, in version order (:func:`pending` checks there is no gap)."""


def mark(migration: Migration) -> tuple[str, int, int] | None:
    """Return what :data:`MARK` writes for ``migration`` (``None`` below :data:`MARKED_FROM`)."""
    if migration.version < MARKED_FROM:
        return None
    return (__version__, runs_beside_schema(), migration.version)


def refuse_newer(where: str, latest: int, marks: Sequence[object] | None) -> None:
    """Raise :class:`ConfigError` when the schema above ``latest`` needs a newer pod than this.

    ``marks`` is the row :data:`MARKS_ABOVE` read: the highest version above
    ``latest``, the release that applied it, and the highest schema the
    versions above ``latest`` need. A version above ours whose release runs
    beside our schema (additive migrations) is tolerated.
    """
    if marks is None:
        return
    applied, release, needs = marks
    if needs is not None and int(str(needs)) > latest:
        raise ConfigError(
            f"{where}: its schema version {applied} was applied by leaseworker {release}, "
            f"which cannot run beside this pod's leaseworker {__version__} (schema {latest}); "
            f"run leaseworker {release} or later"
        )


def refuse_older(where: str, applied: int, oldest_beside: int) -> None:
    """Raise :class:`ConfigError` when the schema is of a release this code cannot run beside.

    ``applied`` between 1 and below ``oldest_beside`` (the schema of the
    oldest release this one runs beside): pods of that older release may still
    use the store, so a pod does not migrate it under them; the operator stops
    them and runs ``leaseworker store migrate`` (which passes 0: no floor).
    """
    if not 0 < applied < oldest_beside:
        return
    held = [release.version for release in RELEASES if release.schema == applied]
    of = f"leaseworker {held[-1]}" if held else "unreleased code"
    raise ConfigError(
        f"{where}: its schema version {applied} is of {of}, which this pod's leaseworker "
        f"{__version__} cannot run beside (schema {oldest_beside} at least); stop the pods "
        "on it, then run leaseworker store migrate"
    )


def pending(applied: int, migrations: Sequence[Migration] = MIGRATIONS) -> list[Migration]:
    """Return the migrations above version ``applied``, in order.

    Versions must run 1, 2, 3, ... without gaps, so "the highest applied
    version" fully describes a database.
    """
    versions = [m.version for m in migrations]
    if versions != list(range(1, len(versions) + 1)):
        raise ValueError(f"migration versions must be 1..n in order, got {versions}")
    return [m for m in migrations if m.version > applied]
