"""mkdocs hooks: the benchmark reports and plots of bench/results/ become part of the site, the
changelog page shows CHANGELOG.md, and the code's NOTE [ ... ] references link to their sections
on the Architecture page.

They are kept once, where the benchmarks write them. The pages link them as a reader of the
repository sees them (``../bench/results/cpu2.md`` from ``docs/benchmarks/index.md`` is
``bench/results/cpu2.md`` at the repository's root), so the same links work on GitHub; here each
file is added to the site as ``bench/results/<name>`` beside the docs, and those links lose the
one ``../`` that leaves docs/.

``docs/changelog.md`` holds one line, ``--8<-- "CHANGELOG.md"``, replaced here by that file with
its nested lists indented by 4 (Keep a Changelog's, and GitHub's, 2-space nesting reads as one flat
list to Python-Markdown).

The docstrings cite the rules the code keeps as ``NOTE [ Slot lease ] in ``_ring````; the
Architecture page has a section for each, with the id ``note-slot-lease``. In every other page
such a citation becomes a link to that section (the private module's name, which may move, is
dropped); a NOTE without its section is a warning, so ``--strict`` fails. A Sphinx role
(``:func:`name```) shows as its name.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

from mkdocs.structure.files import File, InclusionLevel

_RESULTS = "bench/results"
_KINDS = (".md", ".png")
_ARCHITECTURE = "architecture.md"
_NOTE = re.compile(r"NOTE \[ ([^\]<]+?) \](?:\s+in\s+<code>[\w.]+</code>)?")

log = logging.getLogger("mkdocs.hooks.notes")


def on_files(files, config):
    root = Path(config["config_file_path"]).parent
    for path in sorted((root / _RESULTS).iterdir()):
        if path.suffix in _KINDS:
            f = File(f"{_RESULTS}/{path.name}", str(root), config["site_dir"], config["use_directory_urls"])
            if path.suffix == ".md":
                f.inclusion = InclusionLevel.NOT_IN_NAV  # reached from the Benchmarks pages
            files.append(f)
    return files


_INCLUDE = re.compile(r'^--8<-- "([^"]+)"$', re.M)


def _include(m: re.Match, root: Path) -> str:
    text = (root / m[1]).read_text()
    return re.sub(r"^( +)", lambda s: s[1] * 2, text, flags=re.M)


def on_page_markdown(markdown, page, config, files):
    root = Path(config["config_file_path"]).parent
    markdown = _INCLUDE.sub(lambda m: _include(m, root), markdown)
    if page.file.src_uri.startswith(f"{_RESULTS}/"):
        # A report's tables have a dozen columns: the page's whole width, and cells kept on one
        # line (the table scrolls sideways rather than break "117 (70–136)" in three).
        page.meta["hide"] = ["navigation"]
        title, _, body = markdown.partition("\n")
        return f'{title}\n\n<div class="bench-report" markdown>\n{body}\n</div>\n'
    depth = page.file.src_uri.count("/")  # folders between docs/ and the page
    # (../)^(depth+1) bench/results/  ->  (../)^depth bench/results/
    pattern = re.compile(r"\]\(" + re.escape("../" * (depth + 1)) + re.escape(_RESULTS + "/"))
    return pattern.sub("](" + "../" * depth + _RESULTS + "/", markdown)


def note_id(name: str) -> str:
    return "note-" + re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def on_page_content(html, page, config, files):
    if page.file.src_uri == _ARCHITECTURE:
        return html
    architecture = (Path(config["docs_dir"]) / _ARCHITECTURE).read_text()
    up = "../" * page.url.count("/") if config["use_directory_urls"] else "../" * page.file.src_uri.count("/")
    target = up + (_ARCHITECTURE[:-3] + "/" if config["use_directory_urls"] else _ARCHITECTURE[:-3] + ".html")

    def link(m: re.Match) -> str:
        name = " ".join(m[1].split())
        anchor = note_id(name)
        if "{#" + anchor + "}" not in architecture:
            log.warning("%s cites NOTE [ %s ], which %s has no section for (#%s)", page.file.src_uri, name,
                        _ARCHITECTURE, anchor)
        return f'<a href="{target}#{anchor}">NOTE [ {name} ]</a>'

    # Sphinx roles in docstrings (:func:`write_video`): Markdown shows the role's name; keep the name.
    html = re.sub(r":(?:func|class|meth|attr|mod|data|exc):<code>~?([^<]*)</code>", r"<code>\1</code>", html)
    # A docstring's NOTE block opens with its name on a line of its own: keep it a line of its own.
    html = re.sub(r"<p>(NOTE \[ [^\]<]+? \])\n", r"<p><strong>\1</strong><br>\n", html)
    return _NOTE.sub(link, html)
