"""``leaseworker inspect KEY`` lists the key's effects: id, topic, fence, committed, sent, claims.

Each sent one names the relay that sent it (``sent_by``: a pod's relay is ``<pod>:<8 hex>``).

On a real SQLite store file and a real Redis: two messages committed with a
completion, one of them claimed and sent by a relay; JSON (the default) and
``--text`` show the same, and never a message's value.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import anyio
import pytest

from leaseworker import CompletionRequest, open_store
from leaseworker._cli import main
from leaseworker._execution import completion_key
from leaseworker._store import Message, effect_id, effect_store
from leaseworker_dev._services import LocalRedis

SECRET = "s3cr3t-message-value"


def test_inspect_lists_each_effect_with_its_state_in_json_and_text(
    redis_server: LocalRedis, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The sent message shows its send time and one claim; the other says unsent, 0 claims."""
    namespace, key = f"t{uuid.uuid4().hex[:12]}", "report:acme:2026-11"
    url = f"sqlite:///{tmp_path / 'completions.sqlite3'}"
    stored = completion_key(namespace, key)

    async def commit_and_send_one() -> None:
        async with open_store(url) as opened:
            store = effect_store(opened)
            async with store.transaction(stored, "v1", 7) as tx:
                request = CompletionRequest(
                    job_key=stored,
                    input_version="v1",
                    fence=7,
                    result={"ok": True},
                    execution_id="e7",
                    pod="pod-a",
                )
                messages = [Message.build("reports.ready", {"s": SECRET}) for _ in range(2)]
                await tx.commit(request, messages)
            [first] = await store.claim_outbox("pod-a:1a2b3c4d", limit=1, hold=30)
            await store.mark_sent("pod-a:1a2b3c4d", [first.id])

    anyio.run(commit_and_send_one)
    argv = ["inspect", key, "--redis-url", redis_server.url, "--namespace", namespace]
    assert main([*argv, "--store-url", url, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    sent, unsent = shown["effects"]
    assert sent["effect_id"] == effect_id(stored, "v1", 0)
    assert unsent["effect_id"] == effect_id(stored, "v1", 1)
    assert (sent["topic"], sent["fence"], sent["state"], sent["attempts"]) == (
        "reports.ready",
        7,
        "sent",
        1,
    )
    assert sent["committed_at"] <= sent["sent_at"]
    assert str(sent["committed_at"]).endswith("+00:00")
    assert sent["sent_by"] == "pod-a:1a2b3c4d"
    assert (unsent["state"], unsent["sent_at"], unsent["sent_by"], unsent["attempts"]) == (
        "unsent",
        None,
        None,
        0,
    )
    assert main([*argv, "--store-url", url, "--text"]) == 0
    text = capsys.readouterr().out
    assert "effects     2 (1 sent, 1 unsent)" in text
    [head, one, two] = [line.split() for line in text.splitlines()[-3:]]
    assert head[:3] == ["effect", "id", "topic"]
    assert head[-3:] == ["sent", "by", "attempts"]
    assert (one[0], one[2], one[-2], one[-1]) == (sent["effect_id"], "7", "pod-a:1a2b3c4d", "1")
    assert (two[0], two[-3], two[-2], two[-1]) == (unsent["effect_id"], "unsent", "-", "0")
    assert "completion  fence 7, input v1" in text
    assert SECRET not in text
    assert SECRET not in json.dumps(shown)
    assert main(["inspect", "other", "--redis-url", redis_server.url, "--store-url", url]) == 0
    assert json.loads(capsys.readouterr().out)["effects"] == []
