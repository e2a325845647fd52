"""How the suite is spread over pytest-xdist workers (``make test`` runs ``-n auto --dist loadfile``).

A test file is the unit of distribution, so its module fixtures are built once, on one worker;
the reliability suite is one unit, because its files share session fixtures that cost minutes
(the kill campaigns and the study they finish). xdist's own ``--dist loadgroup`` cannot say this
here: xdist 3.8 marks a group by rewriting ``item._nodeid``, which pytest 9 no longer reads.
Files that hold slow or reliability tests are handed out first, in collection order (not
xdist's most-tests-first), so that the longest units do not start last. Nothing here changes
what a test does, only where and when it runs.
"""

from __future__ import annotations

import pytest

_ONE_UNIT = "tests/reliability/"


# optionalhook: the offline GPU node's bare environment runs tests without xdist installed.
@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log) -> object | None:
    if config.getvalue("dist") != "loadfile":
        return None  # another --dist asked for: xdist's own
    from xdist.scheduler import LoadScopeScheduling

    # xdist re-sorts units by their number of tests, which would hand out last the end-to-end
    # files that hold one or two long tests (one worker then ran alone for minutes at the end).
    config.option.loadscopereorder = False

    class FilesAndReliability(LoadScopeScheduling):
        """xdist's file scheduling, with the reliability suite as one unit."""

        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return _ONE_UNIT if path.startswith(_ONE_UNIT) else path

    return FilesAndReliability(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not hasattr(config, "workerinput"):
        return  # not an xdist worker: keep the collection order
    long_files = {
        item.path for item in items if item.get_closest_marker("slow") or item.get_closest_marker("reliability")
    }
    items.sort(key=lambda item: item.path not in long_files)  # stable: each file keeps its order
