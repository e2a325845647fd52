"""A SIGKILL in the middle of ``qhlab.evidence.publish_bytes`` leaves no published file."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from qhlab.evidence import publish_bytes

HELPER = Path(__file__).with_name("_publish_victim.py")
MEBIBYTES = 384


@pytest.mark.reliability
@pytest.mark.timeout(120)
def test_sigkill_mid_publish_leaves_no_published_file(tmp_path: Path) -> None:
    target = tmp_path / "payload.bin"
    proc = subprocess.Popen(
        [sys.executable, str(HELPER), str(target), str(MEBIBYTES)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout.readline().strip() == "writing"
        deadline = time.monotonic() + 60
        temp = None
        # Kill as soon as the temporary file holds some but not all of the payload.
        while time.monotonic() < deadline and proc.poll() is None:
            temps = [p for p in tmp_path.iterdir() if p.name.startswith(".payload.bin.tmp-")]
            if temps and temps[0].stat().st_size > 0:
                temp = temps[0]
                break
            time.sleep(0.0005)
        assert temp is not None, "the helper never started its temporary file"
        killed_at_size = temp.stat().st_size
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGKILL, proc.stderr.read()
    assert killed_at_size < MEBIBYTES * 1024 * 1024
    assert not target.exists()
    # Only the hidden temporary (marked ".tmp-") may remain; it is never a published name.
    leftovers = sorted(p.name for p in tmp_path.iterdir())
    assert all(".tmp-" in name and name.startswith(".") for name in leftovers), leftovers
    # The name is still free: a later publish succeeds and is complete.
    publish_bytes(target, b"complete")
    assert target.read_bytes() == b"complete"
