"""Product files speak of the product: no history words outside the changelog and the decision log.

History (which release, which tuning round, which tracked issue) lives in ``CHANGELOG.md`` and
``docs/decisions/``; code, tests, configs, bench scripts, scripts and documentation say what a
thing is and why, never when it was changed.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_SCANNED = ("src", "tests", "bench", "examples", "scripts", "docs", "README.md")
_HISTORY_PLACES = ("CHANGELOG.md", "docs/decisions/")
# A word of history followed by its number (a range, a "#", a hyphen, a line break and a comment
# marker may sit between them), and a bare tracker reference: a "#" and digits, except in an HTML
# entity or a markdown anchor. The examples below are assembled from parts (``_ref``), so this
# file holds none itself and is scanned like every other.
_HISTORY = re.compile(
    r"\b(?:sessions?|issues?|amendments?|PRs?|pull requests?)(?:[\s#-]|\(|,)*\d[\d-]*"
    r"|(?<![\w&#/\[])(?<!\]\()#\d+\b",
    re.IGNORECASE,
)


def _product_files() -> list[Path]:
    listed = (
        subprocess.run(["git", "ls-files", "-z", "--", *_SCANNED], cwd=ROOT, capture_output=True, check=True)
        .stdout.decode()
        .split("\0")
    )
    return [ROOT / name for name in listed if name and not name.startswith(_HISTORY_PLACES) and (ROOT / name).is_file()]


def history_words(text: str) -> list[str]:
    """Each history word with its number in ``text``, as written (line breaks shown as spaces)."""
    return [" ".join(m.group(0).split()) for m in _HISTORY.finditer(text)]


def test_no_product_file_speaks_of_history():
    found = []
    for path in _product_files():
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue  # a figure or another binary file has no words
        found += [f"{path.relative_to(ROOT)}: {word!r}" for word in history_words(text)]
    assert not found, "history words in product files (move them to CHANGELOG.md or docs/decisions/):\n" + "\n".join(
        found
    )


def _ref(word: str, between: str, number: str) -> str:
    """``word`` + ``between`` + ``number``, built at run time (see the pattern's comment)."""
    return word + between + number


@pytest.mark.parametrize(
    "text",
    [
        "in " + _ref("session", " ", "9") + " it took",
        _ref("sessions", " ", "6-8"),
        "(" + _ref("issue", " ", "18") + ")",
        _ref("issue", " #", "18"),
        _ref("issue", "-", "18"),
        _ref("amendments", " ", "17-22"),
        _ref("Amendment", " ", "3") + " (written before)",
        _ref("issue", "\n# ", "18") + "; was 120",
        "see " + _ref("PR", " ", "12"),
        "fixed in " + _ref("", "#", "18"),
        "fixed (" + _ref("", "#", "18") + ")",
    ],
)
def test_the_check_sees_history(text):
    assert history_words(text)


@pytest.mark.parametrize(
    "text",
    [
        "a session fixture",
        "the issue is the seed",
        "an amendment to the rule",
        "issues a receipt",
        "session-scoped workers",
        "&#18;",
        "[x](#18-heading)",
        "color #ff0000",
    ],
)
def test_the_check_leaves_plain_words(text):
    assert history_words(text) == []


def test_the_citation_names_the_package_version():
    import tomllib

    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    citation = (ROOT / "CITATION.cff").read_text()
    assert re.search(rf'^version: "{re.escape(version)}"$', citation, re.M), citation
    assert f"version = {{{version}}}" in (ROOT / "README.md").read_text()


# A wall time in prose: "took 284 s", "in 17 s", "about 3 s", "in 2 min 51 s".
_WALL_TIME = re.compile(r"\b(took|takes|take|in|about|under)\s+(\d+\s?min(\s\d+\s?s)?\b|\d+(\.\d+)?\s?s\b)")
_HOST = re.compile(r"host|2-core|2 cores")


def test_every_timing_in_the_docs_names_its_host() -> None:
    # Hosts differ by 2.8x on the same fits: a bare time would mislead. A paragraph that states a wall time
    # names where it was measured, unless its page says once, at its top, that every record names its host.
    pages = [ROOT / "README.md", *(ROOT / "docs").rglob("*.md"), *(ROOT / "examples").glob("*.toml")]
    bare = []
    for page in pages:
        text = page.read_text()
        if page.name == "changelog.md" or _HOST.search(text.split("\n## ", 1)[0]):
            continue  # history, or a page that names its host for every record at its top
        for paragraph in re.split(r"\n\s*\n", text):
            if _WALL_TIME.search(paragraph) and not _HOST.search(paragraph):
                bare.append(f"{page.relative_to(ROOT)}: {_WALL_TIME.search(paragraph).group(0)}")
    assert bare == [], bare
