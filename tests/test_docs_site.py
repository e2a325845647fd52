"""The documentation site builds with ``mkdocs build --strict``: a broken link, a missing page in
the nav or an API reference that no longer resolves fails the suite."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _build(config: Path, site: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config),
                           "--site-dir", str(site)], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})


def test_the_site_builds_strictly_with_every_page_and_the_api_reference(tmp_path):
    done = _build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert done.returncode == 0, done.stderr
    site = tmp_path / "site"
    for page in ("index.html", "guide/command-line/index.html", "how-to/add-an-arm/index.html",
                 "decisions/demo-recipe/index.html", "changelog/index.html"):
        assert (site / page).is_file(), page
    api = (site / "reference/api/index.html").read_text()
    for name in ("QhExecutionProfile", "QhCommissioningMilestonesCallback", "QhArchitectureStudyConfig", "freeze_study"):
        assert name in api, name
    assert "Unreleased" in (site / "changelog/index.html").read_text()


def test_a_broken_link_fails_the_build(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# qhlab\n\n[a page that does not exist](nowhere.md)\n")
    config = tmp_path / "mkdocs.yml"
    config.write_text("site_name: t\ndocs_dir: docs\nstrict: true\nvalidation:\n  unrecognized_links: warn\n")
    done = _build(config, tmp_path / "site")
    assert done.returncode != 0
    assert "contains a link 'nowhere.md', but the target is not found among documentation files" in done.stderr
