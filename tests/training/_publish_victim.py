"""Helper for test_publish_kill: publish a large payload with qhlab.evidence.publish_bytes.

Usage: python _publish_victim.py TARGET MEBIBYTES
Prints "writing" just before the call; the test SIGKILLs this process mid-write.
"""

import sys
from pathlib import Path

from qhlab.evidence import publish_bytes


def main() -> int:
    target, mebibytes = Path(sys.argv[1]), int(sys.argv[2])
    payload = b"\x5a" * (mebibytes * 1024 * 1024)
    print("writing", flush=True)
    publish_bytes(target, payload)
    print("published", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
