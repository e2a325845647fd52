"""How the suite is spread over pytest-xdist workers (``make test`` runs ``-n auto --dist loadgroup``).

A test file is the unit of distribution: its module fixtures are built once, on one worker.
Files that share a session fixture costing minutes (the reliability suite's kill campaigns)
form one group, so that fixture is built once too; a fixture of seconds (a finished tiny
study) is cheaper to build on each worker than to serialise every file that reads it.
Without ``--dist loadgroup`` nothing is marked.
"""

from __future__ import annotations

import pytest

# Session fixtures whose files must share one worker: each is built once per worker that needs it.
_SHARED_ONCE = ("crash_campaigns",)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not getattr(config.option, "dist", "no") == "loadgroup":
        return
    group_of_file: dict[str, str] = {}
    for item in items:
        path = str(item.path)
        shared = next((name for name in _SHARED_ONCE if name in item.fixturenames), None)
        if shared is not None:
            group_of_file[path] = shared
        group_of_file.setdefault(path, path)
    for item in items:
        item.add_marker(pytest.mark.xdist_group(group_of_file[str(item.path)]))
