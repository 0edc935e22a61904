"""Headless Chromium (Debian's ``chromium`` package) looking at a page as a person would.

:func:`probe` opens a copy of the page with a script appended that measures
what was drawn (the boxes of lanes, bars, overlap marks) and hovers the first
bar, and returns those measurements from the rendered DOM. :func:`screenshot`
writes a PNG. Each run uses a profile directory of its own, removed after it,
and its process group is killed by PID if it outlives the timeout.
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import Any

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"

_PROBE = """
<script>
(function(){
  function box(el){var r=el.getBoundingClientRect();return {x:r.x,y:r.y,w:r.width,h:r.height};}
  function all(sel){return Array.prototype.slice.call(document.querySelectorAll(sel));}
  var svg=document.querySelector('svg.timeline');
  var bar=document.querySelector('.bar');
  if(bar){bar.dispatchEvent(new MouseEvent('mouseenter'));}
  var found={
    svg: svg ? box(svg) : null,
    lanes: all('.lane').map(function(el){return {pod: el.getAttribute('data-pod'), box: box(el)};}),
    bars: all('.bar').map(function(el){return {cls: el.getAttribute('class'), box: box(el)};}),
    overlaps: all('.overlap').map(box),
    steps: all('.step').map(function(el){return el.getAttribute('class');}),
    takeovers: all('.takeover').length,
    overlapText: (document.querySelector('.overlap-total')||{}).textContent,
    details: document.getElementById('details').textContent
  };
  var out=document.createElement('pre');
  out.id='probe';
  out.textContent=JSON.stringify(found);
  document.body.appendChild(out);
})();
</script>
"""


def probe(page: Path, *, timeout: float = 60.0) -> dict[str, Any]:
    """Render ``page`` and return what the probe script measured in it."""
    copy = page.with_name(page.stem + ".probe.html")
    copy.write_text(page.read_text(encoding="utf-8").replace("</body>", _PROBE + "</body>"))
    try:
        dom = _chromium(["--dump-dom", copy.resolve().as_uri()], timeout)
    finally:
        copy.unlink(missing_ok=True)
    match = re.search(r'<pre id="probe">(.*?)</pre>', dom, re.S)
    assert match is not None, f"the probe did not run; Chromium printed: {dom[:500]!r}"
    found: dict[str, Any] = json.loads(html.unescape(match[1]))
    return found


def screenshot(page: Path, png: Path, *, size: str = "1200,560", timeout: float = 60.0) -> None:
    """Write a PNG of ``page`` as a ``size`` (width,height) window shows it."""
    _chromium(
        [f"--window-size={size}", f"--screenshot={png.resolve()}", page.resolve().as_uri()],
        timeout,
    )


def _chromium(args: list[str], timeout: float) -> str:
    profile = tempfile.mkdtemp(prefix="leaseworker-chromium-")
    argv = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",  # tests may run as root, which Chromium's sandbox refuses
        "--disable-gpu",
        "--hide-scrollbars",
        "--no-first-run",
        "--disable-extensions",
        "--disable-background-networking",
        f"--user-data-dir={profile}",
        *args,
    ]
    process = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
        start_new_session=True,  # its own process group: killed as one on a timeout
        env={**os.environ, "HOME": profile},
    )
    try:
        out, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        raise
    finally:
        shutil.rmtree(profile, ignore_errors=True)
    assert process.returncode == 0, f"chromium exited with {process.returncode}"
    return out.decode(errors="replace")
