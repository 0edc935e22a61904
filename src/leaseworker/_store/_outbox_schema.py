"""The outbox's migrations: messages committed with completions, and the relays' claims and rounds.

Part of :data:`._schema.MIGRATIONS` (versions 5, 6, 7, 9, 10 and 11); see
docs/effects.md for what the tables hold.
"""

from __future__ import annotations

from ._migration import Migration

# What ``leaseworker_outbox_state`` reads (migrations 9 and 11): each row's
# state, unsent while queued, else sent in its round (relay, time, attempts).
_STATE_COLUMNS = """
    SELECT o.id, o.job_key, o.input_version, o.seq, o.fence, o.topic, o.msg_key,
           o.value, o.headers, o.trace, o.committed_at, o.claimed_by, o.claimed_until,
           s.relay AS sent_by, s.sent_at,
           coalesce(u.attempts, s.attempts[array_position(s.ids, o.id)], 0) AS attempts
"""
_STATE_JOINS = """
    FROM leaseworker_outbox o
    LEFT JOIN leaseworker_outbox_unsent u ON u.id = o.id
    LEFT JOIN LATERAL (
        SELECT r.relay, r.sent_at, r.ids, r.attempts FROM leaseworker_outbox_sent r
        WHERE u.id IS NULL AND o.id = ANY (r.ids)
          AND int8range(r.ids[1], r.ids[array_upper(r.ids, 1)], '[]') @> o.id
        ORDER BY r.id LIMIT 1
    ) s ON true
"""

OUTBOX_MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        version=5,
        description="leaseworker_outbox: messages committed with completions, for the relay",
        postgresql=(
            # id orders one job key's rows in commit order: they are inserted
            # under the key's head row lock. claimed_by/claimed_until: a relay's
            # claim, taken over once expired; sent_at: the broker acknowledged.
            """
            CREATE TABLE leaseworker_outbox (
                id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                job_key       text NOT NULL,
                input_version text NOT NULL,
                seq           integer NOT NULL,
                fence         bigint NOT NULL,
                topic         text NOT NULL,
                msg_key       bytea,
                value         bytea NOT NULL,
                headers       text NOT NULL,
                trace         text NOT NULL,
                committed_at  timestamptz NOT NULL DEFAULT now(),
                claimed_by    text,
                claimed_until timestamptz,
                sent_at       timestamptz,
                UNIQUE (job_key, input_version, seq)
            )
            """,
            "CREATE INDEX leaseworker_outbox_unsent ON leaseworker_outbox (id)"
            " WHERE sent_at IS NULL",
            "CREATE INDEX leaseworker_outbox_key ON leaseworker_outbox (job_key, id)"
            " WHERE sent_at IS NULL",
        ),
        sqlite=(
            """
            CREATE TABLE leaseworker_outbox (
                id            INTEGER PRIMARY KEY AUTOINCREMENT,
                job_key       TEXT NOT NULL,
                input_version TEXT NOT NULL,
                seq           INTEGER NOT NULL,
                fence         INTEGER NOT NULL,
                topic         TEXT NOT NULL,
                msg_key       BLOB,
                value         BLOB NOT NULL,
                headers       TEXT NOT NULL,
                trace         TEXT NOT NULL,
                committed_at  INTEGER NOT NULL,
                claimed_by    TEXT,
                claimed_until INTEGER,
                sent_at       INTEGER,
                UNIQUE (job_key, input_version, seq)
            )
            """,
            "CREATE INDEX leaseworker_outbox_unsent ON leaseworker_outbox (id)"
            " WHERE sent_at IS NULL",
        ),
    ),
    Migration(
        version=6,
        description="leaseworker_outbox.attempts: how many times relays claimed a message",
        postgresql=(
            "ALTER TABLE leaseworker_outbox ADD COLUMN attempts integer NOT NULL DEFAULT 0",
        ),
        sqlite=("ALTER TABLE leaseworker_outbox ADD COLUMN attempts INTEGER NOT NULL DEFAULT 0",),
    ),
    Migration(
        version=7,
        description="leaseworker_outbox fillfactor 50: a relay's claim updates its rows in place",
        postgresql=(
            # Half of each page is left free, so a claim's new row version fits
            # on its page and is a HOT update (its columns are in no index): no
            # index entries written (``attempts``, which claims also bump, is in
            # none either); the relay drained a backlog 1.4x faster.
            # Applies to pages written from now on: no rewrite, and the ALTER's
            # SHARE UPDATE EXCLUSIVE lock lets commits and claims go on.
            "ALTER TABLE leaseworker_outbox SET (fillfactor = 50)",
        ),
        sqlite=(),  # SQLite has no fillfactor; its claims rewrite the row in its b-tree page
    ),
    Migration(
        version=9,
        description="PostgreSQL outbox: a queue of unsent ids, rounds of sent ones; no row marked",
        postgresql=(
            # What is unsent is a row of the queue (its id, key and attempts),
            # added in the inserting statement, whoever inserts;
            # a relay's claim locks queue rows, its mark deletes them (a
            # delete only stamps the tuple: no new version, no index entry)
            # and records the round: one row of sent ids, their relay, time
            # and attempts. The outbox row itself is written once, at commit;
            # the partial indexes on its sent_at go (the queue's replace them).
            "DROP INDEX leaseworker_outbox_unsent",
            "DROP INDEX leaseworker_outbox_key",
            """
            CREATE TABLE leaseworker_outbox_unsent (
                id       bigint PRIMARY KEY,
                job_key  text NOT NULL,
                attempts integer NOT NULL DEFAULT 0
            )
            """,
            "CREATE INDEX leaseworker_outbox_unsent_key ON leaseworker_outbox_unsent (job_key, id)",
            """
            CREATE TABLE leaseworker_outbox_sent (
                id       bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                relay    text,
                sent_at  timestamptz NOT NULL,
                ids      bigint[] NOT NULL,
                attempts integer[] NOT NULL
            )
            """,
            # ids ascending: a row's round is found by the span of its ids.
            "CREATE INDEX leaseworker_outbox_sent_span ON leaseworker_outbox_sent"
            " USING gist (int8range(ids[1], ids[array_upper(ids, 1)], '[]'))",
            # This version's insert queues its rows itself (``queued``: one
            # statement, no trigger call); a row-level trigger queues the rows
            # of code that does not (an earlier version's pod mid-upgrade).
            "ALTER TABLE leaseworker_outbox ADD COLUMN queued boolean NOT NULL DEFAULT false",
            """
            CREATE FUNCTION leaseworker_outbox_queue() RETURNS trigger LANGUAGE plpgsql AS $fn$
            BEGIN
                INSERT INTO leaseworker_outbox_unsent (id, job_key) VALUES (NEW.id, NEW.job_key);
                RETURN NULL;
            END
            $fn$
            """,
            # Created before the copy below: its lock waits out inserts in flight.
            """
            CREATE TRIGGER leaseworker_outbox_queue AFTER INSERT ON leaseworker_outbox
            FOR EACH ROW WHEN (NOT NEW.queued) EXECUTE FUNCTION leaseworker_outbox_queue()
            """,
            "INSERT INTO leaseworker_outbox_unsent (id, job_key, attempts)"
            " SELECT id, job_key, attempts FROM leaseworker_outbox WHERE sent_at IS NULL",
            # Rows sent before: one round per mark (a mark stamped its rows alike).
            """
            INSERT INTO leaseworker_outbox_sent (relay, sent_at, ids, attempts)
            SELECT claimed_by, sent_at, array_agg(id ORDER BY id), array_agg(attempts ORDER BY id)
            FROM leaseworker_outbox WHERE sent_at IS NOT NULL
            GROUP BY claimed_by, sent_at ORDER BY min(id)
            """,
            # Relays of earlier code claim rows whose claimed_until is NULL or
            # past: rows committed from now on are never theirs (they would
            # send again what this version's relays sent, whose sent_at stays NULL).
            "ALTER TABLE leaseworker_outbox ALTER COLUMN claimed_until SET DEFAULT 'infinity'",
            # A row's state as the store reads it.
            f"CREATE VIEW leaseworker_outbox_state AS {_STATE_COLUMNS} {_STATE_JOINS}",
        ),
        sqlite=(),  # SQLite marks its rows in the batches' write transaction (docs/effects.md)
    ),
    Migration(
        version=10,
        description="PostgreSQL outbox rounds: their id and attempt arrays stored uncompressed",
        postgresql=(
            # A round's arrays (12 bytes a message) were compressed at every
            # mark: pglz on 12 KB took 2.4 of a 1,000-row mark's 4.5 ms in the
            # backend (bench/README.md, relay). Kept for ``retention`` only, so
            # the bytes saved were few. Rows written from now on; a catalog-only
            # change under a brief lock.
            "ALTER TABLE leaseworker_outbox_sent ALTER COLUMN ids SET STORAGE EXTERNAL,"
            " ALTER COLUMN attempts SET STORAGE EXTERNAL",
        ),
        sqlite=(),
    ),
    Migration(
        version=11,
        description="leaseworker_outbox.effect_id: each message's effect id, written at commit",
        postgresql=(
            # The relay sent a sha256 it computed per row at every send (13 % of
            # its own time); the committing pod computes it anyway. Rows of
            # earlier code keep NULL: the relay computes theirs. A catalog-only
            # change (no default); the view gets the column at its end.
            "ALTER TABLE leaseworker_outbox ADD COLUMN effect_id text",
            "CREATE OR REPLACE VIEW leaseworker_outbox_state AS"
            f" {_STATE_COLUMNS}, o.effect_id {_STATE_JOINS}",
        ),
        sqlite=("ALTER TABLE leaseworker_outbox ADD COLUMN effect_id TEXT",),
    ),
)
"""The outbox's migrations, in version order."""
