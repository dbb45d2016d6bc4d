"""mkdocs hook: the site is titled with the release; README.md, BENCHMARKS.md and
CHANGELOG.md stay at the repository root, where GitHub shows them, and join the site as
generated pages.

Their links are written for GitHub, relative to the root (``docs/semantics.md``,
``docs/bench_cpu.png``), and the guide pages link back to them as ``../BENCHMARKS.md``.
Both are rewritten to the site's layout, where the root files' pages sit beside the guide
pages, so that strict mode checks every link against a page that exists.
"""

from __future__ import annotations

import re
from pathlib import Path

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[1]
# Root file -> its page on the site.
PAGES = {"README.md": "index.md", "BENCHMARKS.md": "benchmarks.md", "CHANGELOG.md": "changelog.md"}
# A Markdown link's or image's target, up to a "#" or ")": "](target".
LINK = re.compile(r"\]\((?!https?:|#)([^)#\s]+)")
# BENCHMARKS.md marks each figure with the run it comes from, "[a]", "[b]"...: "[a] [b]"
# would read as a reference link (which the cross-reference plugin reports as broken).
RUN_MARK = re.compile(r"\[([a-z])\](?![(\[])")


def on_config(config):
    # The release the site documents, read from where it is written (roiops/__init__.py).
    version = re.search(r'^__version__ = "(.+)"$', (ROOT / "roiops" / "__init__.py").read_text(), re.M).group(1)
    config.site_name = f"roiops {version}"
    return config


def on_files(files: Files, config) -> Files:
    for name, page in PAGES.items():
        files.append(File.generated(config, page, content=(ROOT / name).read_text(encoding="utf-8")))
    return files


def _on_site(target: str, from_root: bool) -> str:
    """Where a link's target is on the site."""
    name = target if from_root else target.removeprefix("../")
    if name in PAGES:
        return PAGES[name]
    return target.removeprefix("docs/") if from_root else target


def on_page_markdown(markdown: str, page, config, files) -> str:
    from_root = page.file.src_uri in PAGES.values()
    if page.file.src_uri == PAGES["BENCHMARKS.md"]:
        markdown = RUN_MARK.sub(r"\\[\1\\]", markdown)
    return LINK.sub(lambda m: "](" + _on_site(m.group(1), from_root), markdown)
