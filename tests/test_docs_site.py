"""The documentation site builds with ``mkdocs build --strict``: a broken link, a missing page in
the nav or an API reference that no longer resolves fails the suite."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _build(config: Path, site: Path, *, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config), "--site-dir", str(site)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )


def test_the_site_builds_strictly_with_every_page_and_the_api_reference(tmp_path):
    done = _build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert done.returncode == 0, done.stderr
    site = tmp_path / "site"
    for page in (
        "index.html",
        "getting-started/index.html",
        "guide/command-line/index.html",
        "how-to/add-an-arm/index.html",
        "how-to/query-populations/index.html",
        "concepts/evidence/index.html",
        "concepts/learning-rule/index.html",
        "concepts/statistics/index.html",
        "concepts/physics/index.html",
        "decisions/demo-recipe/index.html",
        "how-to/export-results/index.html",
        "reference/report-json/index.html",
        "reference/report.schema.json",
        "changelog/index.html",
    ):
        assert (site / page).is_file(), page
    api = (site / "reference/api/index.html").read_text()
    for name in (
        "QhExecutionProfile",
        "QhCommissioningMilestonesCallback",
        "QhArchitectureStudyConfig",
        "freeze_study",
        # the two objects a user arm's builder receives, each with its own entry
        'id="qhlab.finite_horizon.architecture.ArchitectureConfig"',
        'id="qhlab.finite_horizon.architecture.ScorerDims"',
    ):
        assert name in api, name
    assert "Unreleased" in (site / "changelog/index.html").read_text()


def test_a_broken_link_fails_the_projects_build(tmp_path):
    # The project's own mkdocs.yml, hook and pages, on a copy with one link that goes nowhere.
    for name in ("mkdocs.yml", "CHANGELOG.md"):
        shutil.copy(ROOT / name, tmp_path / name)
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    (tmp_path / "src").symlink_to(ROOT / "src", target_is_directory=True)
    with (tmp_path / "docs" / "results.md").open("a") as page:
        page.write("\n[a page that does not exist](nowhere.md)\n")
    done = _build(tmp_path / "mkdocs.yml", tmp_path / "site", cwd=tmp_path)
    assert done.returncode != 0
    assert (
        "'results.md' contains a link 'nowhere.md', but the target is not found among documentation files"
        in done.stderr
    )


def test_the_results_page_and_the_readme_carry_the_same_generated_block():
    """Both are written by ``scripts/readme-excerpt`` from one report; neither is typed."""
    start, end = "<!-- result-excerpt:start -->", "<!-- result-excerpt:end -->"
    blocks = []
    for page in (ROOT / "README.md", ROOT / "docs" / "results.md"):
        text = page.read_text(encoding="utf-8")
        assert text.count(start) == 1 and text.count(end) == 1, page
        blocks.append(text[text.index(start) : text.index(end)])
    assert blocks[0] == blocks[1]
    assert "| baseline | baseline |" in blocks[0] and "myopic oracle" in blocks[0]
