"""MkDocs build hooks for the hierax site.

- Serve the runnable scripts of `examples/` with the site, so that pages link to
  them (`examples/<name>.py`) and readers can download them.
- Pull the benchmark results (`benchmarks/README.md` and `benchmarks/figures/*.png`)
  into the Benchmarks page at build time, instead of keeping a copy in `docs/`. When
  they have not been produced yet, the page says how to produce them.
"""

import pathlib
import re

from mkdocs.structure.files import File, Files


ROOT = pathlib.Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
BENCHMARKS = ROOT / "benchmarks"
FIGURES = BENCHMARKS / "figures"
MARKER = "<!-- hierax:benchmarks -->"


def _add(files: Files, path: pathlib.Path, src_uri: str, config) -> None:
    files.append(File.generated(config, src_uri, abs_src_path=str(path)))


def on_files(files: Files, config) -> Files:
    for script in sorted(EXAMPLES.glob("*.py")):
        _add(files, script, f"examples/{script.name}", config)
    for figure in sorted(FIGURES.glob("*.png")):
        _add(files, figure, f"benchmarks/figures/{figure.name}", config)
    return files


_LINK = re.compile(r"(!?)\[([^\]]*)\]\(([^)\s]+)\)")


def _rewrite_link(match: re.Match) -> str:
    bang, text, target = match.groups()
    if re.match(r"^[a-z]+:", target) or target.startswith("#"):
        return match.group(0)
    path = (BENCHMARKS / target).resolve()
    if path.parent == FIGURES.resolve() and path.suffix == ".png" and path.exists():
        return f"{bang}[{text}](benchmarks/figures/{path.name})"
    # Anything else the README points at is not part of the site: keep the words.
    return f"{text} (`{target}`)" if not bang else f"*{text}* (`{target}`)"


def _benchmark_section() -> str:
    readme = BENCHMARKS / "README.md"
    figures = sorted(FIGURES.glob("*.png"))
    if not readme.exists() and not figures:
        return (
            '!!! note "No benchmark results in this build"\n\n'
            "    This site was built before the benchmarks were run. Run `make bench` "
            "(which writes\n    `benchmarks/README.md` and `benchmarks/figures/*.png`) "
            "and rebuild with `make docs`.\n"
        )
    parts = []
    if readme.exists():
        text = readme.read_text(encoding="utf-8")
        # The page has its own title: the README's headings go one level down.
        text = re.sub(r"^(#{1,5}) ", r"#\1 ", text, flags=re.MULTILINE)
        text = _LINK.sub(_rewrite_link, text)
        parts.append(text)
    shown = set(re.findall(r"benchmarks/figures/([^)\s]+\.png)", "\n".join(parts)))
    rest = [f for f in figures if f.name not in shown]
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
