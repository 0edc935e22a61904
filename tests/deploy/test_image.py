"""The worker image itself: who it runs as, what it holds, and a read-only root filesystem."""

from __future__ import annotations

import json
import re

from .podman import Podman

CREDENTIAL = re.compile(
    r"(?i)password|passwd=|secret|token|api[_-]?key|pip_cert|BEGIN [A-Z ]*PRIVATE"
    r"|://[^/\s:@]+:[^/\s@]+@"  # a URL with user:password
)
"""What a credential (or the build's CA-bundle secret) would look like in history or config."""


def test_the_image_runs_as_uid_10001_never_root(engine: Podman, image: str) -> None:
    """USER is 10001:10001 and a process started from the image has uid and gid 10001."""
    user = engine("image", "inspect", "--format", "{{.Config.User}}", image).stdout.strip()
    assert user == "10001:10001"
    ids = engine("run", "--rm", "--read-only", "--entrypoint", "id", image, "-u").stdout
    assert ids.strip() == "10001"
    groups = engine("run", "--rm", "--read-only", "--entrypoint", "id", image, "-g").stdout
    assert groups.strip() == "10001"


def test_the_image_holds_no_credential_in_its_history_or_configuration(
    engine: Podman, image: str
) -> None:
    """`podman history` and the image config (env, labels, cmd) name no credential.

    The build's CA bundle went in as a build secret: neither its id nor a
    /run/secrets file is left in the image.
    """
    for planted in ("ENV REDIS_URL=redis://app:s3cr3t@redis:6379/0", "ARG API_KEY=x"):
        assert CREDENTIAL.search(planted)  # the check can fail
    history = engine("history", "--no-trunc", "--format", "{{.CreatedBy}}", image).stdout
    assert history.strip()
    [config] = json.loads(engine("image", "inspect", image).stdout)
    shown = {
        "history": history,
        "env": "\n".join(config["Config"].get("Env") or []),
        "labels": json.dumps(config["Config"].get("Labels") or {}),
        "command": json.dumps([config["Config"].get("Entrypoint"), config["Config"].get("Cmd")]),
    }
    for where, text in shown.items():
        assert not CREDENTIAL.search(text), f"{where}: {CREDENTIAL.search(text)}"
    found = engine("run", "--rm", "--read-only", "--entrypoint", "ls", image, "-A", "/run/secrets",
                   check=False)  # fmt: skip
    assert found.stdout.strip() == ""


def test_the_worker_starts_on_a_read_only_root_filesystem(engine: Podman, image: str) -> None:
    """With --read-only, `leaseworker run` loads the default job; writes to the root fail."""
    check = (
        "import importlib, os, tempfile\n"
        "importlib.import_module('examples.report_job.monthly_report')\n"
        "tempfile.NamedTemporaryFile(dir='/tmp').close()\n"  # /tmp is a tmpfs, as in k8s
        "try:\n    open('/app/x', 'w')\nexcept OSError as e:\n    print(e.errno)\n"
    )
    done = engine("run", "--rm", "--read-only", "--entrypoint", "python3", image, "-c", check)
    assert done.stdout.strip() == "30"  # EROFS
    help_text = engine("run", "--rm", "--read-only", image, "--help").stdout
    assert "usage: leaseworker run" in help_text
