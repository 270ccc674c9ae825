"""MkDocs build hooks for the hierax site.

- Serve the runnable scripts of `examples/` with the site, so that pages link to
  them (`examples/<name>.py`) and readers can download them; serve the repository's
  `LICENSE` as `LICENSE.txt`.
- Pull the benchmark results into the Benchmarks page at build time, instead of
  keeping a copy in `docs/`: the committed `benchmarks/README.md` and
  `benchmarks/figures/*.png` when they exist, else the output of a local
  `make bench` (`benchmarks/out/hierarchies/results.md` and its `*.png`). When there
  are none, the page says how to produce them.
- Show formulas in the search index's text without their math delimiters, so that
  search results read `U(t)`, not the TeX source with its delimiters.
- Fail the build when an API entry names a member (`members: [...]`) that the page
  does not render (a method moved to a base class renders only with
  `inherited_members`, and was dropped from the page without a word).
- Write the 404 page's links relative, as the root's pages are, so that it works
  opened from disk; served over HTTP, a script puts them under the site's path.
"""

import json
import pathlib
import re
import urllib.parse

from mkdocs.plugins import event_priority
from mkdocs.structure.files import File, Files


ROOT = pathlib.Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
BENCHMARKS = ROOT / "benchmarks"
MARKER = "<!-- hierax:benchmarks -->"


def _results() -> tuple[pathlib.Path | None, list[pathlib.Path]]:
    """The benchmark tables (a Markdown file) and figures to show, if any: the
    committed ones first, then those of a local run."""
    local = BENCHMARKS / "out" / "hierarchies"  # where the runner puts the run's files
    markdowns = [BENCHMARKS / "README.md", local / "results.md"]
    markdown = next((m for m in markdowns if m.exists()), None)
    figures: list[pathlib.Path] = []
    for folder in (BENCHMARKS / "figures", local):
        figures = sorted(folder.glob("*.png"))
        if figures:
            break
    return markdown, figures


def _add(files: Files, path: pathlib.Path, src_uri: str, config) -> None:
    files.append(File.generated(config, src_uri, abs_src_path=str(path)))


def on_files(files: Files, config) -> Files:
    for script in sorted(EXAMPLES.glob("*.py")):
        _add(files, script, f"examples/{script.name}", config)
    _add(files, ROOT / "LICENSE", "LICENSE.txt", config)
    for figure in _results()[1]:
        _add(files, figure, f"benchmarks/figures/{figure.name}", config)
    return files


_LINK = re.compile(r"(!?)\[([^\]]*)\]\(([^)\s]+)\)")


def _rewrite_links(text: str, figures: list[pathlib.Path]) -> str:
    """Point links at figures to their copies in the site; other relative links
    lead outside the site, so keep only their words."""
    served = {figure.name for figure in figures}

    def rewrite(match: re.Match) -> str:
        bang, words, target = match.groups()
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            return match.group(0)
        name = pathlib.PurePosixPath(target).name
        if target.endswith(".png") and name in served:
            return f"{bang}[{words}](benchmarks/figures/{name})"
        if words.strip("`") == target:
            return words
        return f"*{words}* (`{target}`)" if bang else f"{words} (`{target}`)"

    return _LINK.sub(rewrite, text)


def _benchmark_section() -> str:
    markdown, figures = _results()
    if markdown is None and not figures:
        return (
            '!!! note "No benchmark results in this build"\n\n'
            "    This site was built before the benchmarks were run. Run `make bench` "
            "(which writes\n    its tables and plots to `benchmarks/out/`) and rebuild "
            "with `make docs`.\n"
        )
    parts = []
    if markdown is not None:
        text = markdown.read_text(encoding="utf-8")
        # The page has its own title: drop the results' title, and their other
        # headings go one level down.
        text = re.sub(r"\A\s*# [^\n]*\n", "", text)
        text = re.sub(r"^(#{1,5}) ", r"#\1 ", text, flags=re.MULTILINE)
        parts.append(_rewrite_links(text, figures))
    shown = set(re.findall(r"benchmarks/figures/([^)\s]+\.png)", "\n".join(parts)))
    rest = [figure for figure in figures if figure.name not in shown]
    if rest:
        parts.append("## Figures\n")
        for figure in rest:
            title = figure.stem.replace("_", " ").replace("-", " ")
            parts.append(f"![{title}](benchmarks/figures/{figure.name})\n")
    return "\n".join(parts)


def on_page_markdown(markdown: str, page, config, files) -> str:
    if MARKER in markdown:
        markdown = markdown.replace(MARKER, _benchmark_section())
    return markdown


# An API entry with the members it lists: `::: hierax.X` then its options block.
_ENTRY = re.compile(r"^::: (hierax\.[\w.]+)\n((?:[ ]{4}.*\n)+)", re.MULTILINE)
_MEMBERS = re.compile(r"^\s+members: \[([^\]]*)\]", re.MULTILINE)


def listed_members(markdown: str) -> list[tuple[str, str]]:
    """Each `(object, member)` an API entry of `markdown` lists in `members`."""
    found = []
    for entry in _ENTRY.finditer(markdown):
        listed = _MEMBERS.search(entry.group(2))
        if listed:
            names = [n.strip() for n in listed.group(1).split(",") if n.strip()]
            found.extend((entry.group(1), name) for name in names)
    return found


def on_page_content(html: str, page, config, files) -> str:
    missing = [
        f"{name}.{member}"
        for name, member in listed_members(page.file.content_string)
        if f'id="{name}.{member}"' not in html
    ]
    if missing:
        raise ValueError(
            f"{page.file.src_uri}: members listed but not rendered: {missing} (one "
            "defined on a base class needs `inherited_members: true`)"
        )
    return html


# The 404 page is served at any missing URL, so MkDocs writes its links absolute
# (from the path of `site_url`); opened from disk (`site/404.html`), those lead to
# the root of the file system. It sits at the site's root, as `index.html` does:
# its links are written relative like that page's, which works from disk, and when
# it is served over HTTP a `<base>` element (and the base of the theme's
# configuration) puts them back under the site's path, at whatever depth the
# missing URL was.
_SERVED_404 = """<script>
if (location.protocol !== "file:") {
  const base = document.createElement("base");
  base.href = {base};
  document.head.prepend(base);
}
</script>"""
_SERVED_404_CONFIG = """<script>
if (location.protocol !== "file:") {
  const element = document.getElementById("__config");
  const config = JSON.parse(element.textContent);
  config.base = document.baseURI;
  element.textContent = JSON.stringify(config);
}
</script>"""


def on_template_context(context, template_name: str, config):
    if template_name == "404.html":
        context["base_url"] = "."
    return context


def on_post_template(output: str, template_name: str, config) -> str:
    if template_name != "404.html":
        return output
    base = urllib.parse.urlsplit(config.site_url or "/").path or "/"
    head = _SERVED_404.replace("{base}", json.dumps(base))
    output = output.replace("<head>", "<head>\n" + head, 1)
    # After the theme's configuration, before the script that reads it.
    config_end = re.search(r'<script id="__config"[^>]*>.*?</script>', output, re.S)
    assert config_end is not None, "the theme's 404 page has no configuration"
    end = config_end.end()
    return output[:end] + "\n" + _SERVED_404_CONFIG + output[end:]


# The search plugin indexes each page's HTML text, where pymdownx.arithmatex leaves
# the TeX of a formula between `\(`, `\)` (inline) and `\[`, `\]` (display), and
# search results show that text as it is: no KaTeX runs on them. Without the
# delimiters and TeX's spacing commands, they read `U(t)` and `X_k(t)`.
_MATH = re.compile(r"\\\((.+?)\\\)|\\\[(.+?)\\\]", re.S)
_TEX_SPACE = re.compile(r"\\[,;:! ]|\\q?quad\b")


def _plain_math(text: str) -> str:
    def plain(match: re.Match) -> str:
        tex = match.group(1) if match.group(1) is not None else match.group(2)
        return " ".join(_TEX_SPACE.sub(" ", tex).split())

    return _MATH.sub(plain, text)


# After the search plugin writes the index (priority 0), before the offline plugin
# copies it into `search_index.js` (priority -100).
@event_priority(-50)
def on_post_build(config) -> None:
    path = pathlib.Path(config.site_dir) / "search" / "search_index.json"
    if not path.exists():
        return
    index = json.loads(path.read_text(encoding="utf-8"))
    for entry in index["docs"]:
        entry["title"] = _plain_math(entry["title"])
        entry["text"] = _plain_math(entry["text"])
    path.write_text(json.dumps(index, separators=(",", ":")), encoding="utf-8")
