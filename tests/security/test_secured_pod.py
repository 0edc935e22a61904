"""A pod through Redis TLS and PostgreSQL verify-full, the TLS files given as flags.

Redis TLS with the documented ACL user, PostgreSQL verify-full as the runtime
role, both credentials from files, the CA and client certificate from the
``--redis-ca-file``, ``--redis-cert-file``, ``--redis-key-file`` flags and variables.
"""

from __future__ import annotations

import signal
import uuid
from pathlib import Path

import psycopg

from leaseworker_dev._services import LocalKafka

from ..kafka_util import KafkaNames, payload, produce
from ..pods import spawn_pod
from ..waiting import eventually
from .conftest import OWNER, RUNTIME, SecurePostgres, SecureRedis


async def test_tls_a_pod_completes_a_job_through_redis_tls_acl_and_postgres_verify_full(
    kafka_server: LocalKafka,
    topic: str,
    kafka_names: KafkaNames,
    redis_tls: SecureRedis,
    secure_postgres: SecurePostgres,
    tmp_path: Path,
) -> None:
    """The job runs under its lease and its completion lands in the store, nothing refused."""
    redis_file, store_file = tmp_path / "redis-url", tmp_path / "store-url"
    bare = redis_tls.url().partition("?")[0]  # the TLS files come from the flags
    redis_file.write_text(bare + "\n")
    store_file.write_text(secure_postgres.url(RUNTIME) + "\n")
    files = redis_tls.tls
    env = {
        "LW_TEST_TOPIC": topic,
        "LEASEWORKER_REDIS_URL_FILE": str(redis_file),
        "LEASEWORKER_STORE_URL_FILE": str(store_file),
        "LEASEWORKER_REDIS_CA_FILE": str(files.server.ca),
    }
    pod = spawn_pod(
        "secured",
        tmp_path,
        env,
        "--bootstrap-servers",
        kafka_server.bootstrap_servers,
        "--group",
        kafka_names.group,
        "--redis-cert-file",
        str(files.client.cert),
        "--redis-key-file",
        str(files.client.key),
    )
    try:
        job = f"secured-{uuid.uuid4().hex[:8]}"
        await produce(kafka_server.bootstrap_servers, topic, [(job.encode(), payload(job))])

        async def completed() -> bool:
            with psycopg.connect(secure_postgres.url(OWNER)) as conn:
                row = conn.execute(
                    "SELECT count(*) FROM leaseworker_completions WHERE job_key LIKE %s",
                    (f"%{{{job}}}",),
                ).fetchone()
            return row == (1,)

        await eventually(completed, within=60)
        pod.signal(signal.SIGTERM)
        assert await pod.wait_exit(30) == 0
    finally:
        pod.kill()
    log = pod.log_text()
    assert redis_tls.password not in log
    assert secure_postgres.passwords[RUNTIME] not in log
