"""Helper for test_execution_profile: hold or contend for WandbAttempt writer locks in its own process.

Usage: python _lock_holder.py hold ROOT LOGICAL_ID RELEASE_FILE
       python _lock_holder.py contend ROOT
``hold`` prints "held <lock path>" once it holds the lock and keeps it until RELEASE_FILE
exists. ``contend`` reads one logical run id per stdin line, tries that run's lock once
(non-blocking) and prints one line: "acquired <seconds>" or
"refused <seconds> <exit code> <LockHeldError message>".
"""

import sys
import time
from pathlib import Path

from qhlab.evidence import LockHeldError
from qhlab.training.execution_profile import WandbAttempt


def main() -> int:
    mode, root = sys.argv[1], Path(sys.argv[2])
    if mode == "hold":
        logical, release = sys.argv[3], Path(sys.argv[4])
        attempt = WandbAttempt(f"{logical}-holder", offline=True, logical_run_id=logical)
        with attempt.local_writer_lock(root) as lock:
            print(f"held {lock}", flush=True)
            deadline = time.monotonic() + 60
            while not release.exists() and time.monotonic() < deadline:
                time.sleep(0.01)
        return 0
    for line in sys.stdin:
        logical = line.strip()
        attempt = WandbAttempt(f"{logical}-contender", offline=True, logical_run_id=logical)
        start = time.monotonic()
        try:
            with attempt.local_writer_lock(root):
                print(f"acquired {time.monotonic() - start:.3f}", flush=True)
        except LockHeldError as exc:
            message = str(exc).replace("\n", " ")
            print(f"refused {time.monotonic() - start:.3f} {exc.exit_code} {message}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
