"""Build the documentation site strictly and check its API coverage and links."""

import ast
import dataclasses
import html
import html.parser
import importlib.util
import os
import pathlib
import posixpath
import re
import subprocess
import sys
import urllib.parse

import pytest


ROOT = pathlib.Path(__file__).resolve().parent.parent
_MISSING = [
    name
    for name in ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python")
    if importlib.util.find_spec(name.split(".")[0]) is None
]
pytestmark = pytest.mark.skipif(
    bool(_MISSING),
    reason=f"docs tools not installed ({', '.join(_MISSING)}): "
    "pip install -e '.[docs]'",
)


def public_names() -> list[str]:
    """Names re-exported by `src/hierax/__init__.py` (`from ._x import A as A`)."""
    tree = ast.parse((ROOT / "src" / "hierax" / "__init__.py").read_text())
    names = []
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            names.extend(alias.asname or alias.name for alias in node.names)
    return [name for name in names if name != "__version__"]


class _Parser(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.ids: set[str] = set()
        self.links: list[tuple[str, str]] = []  # (attribute, value)

    def handle_starttag(self, tag, attrs):
        values = {key: value for key, value in attrs if value}
        for key in ("id", "name"):
            if key in values and (key == "id" or tag == "a"):
                self.ids.add(values[key])
        if tag in ("a", "link") and "href" in values:
            self.links.append(("href", values["href"]))
        if tag in ("img", "script") and "src" in values:
            self.links.append(("src", values["src"]))


@dataclasses.dataclass
class Site:
    root: pathlib.Path
    pages: dict[
        str, _Parser
    ]  # by path relative to the root, e.g. "api/operators/index.html"


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Site:
    """Build the site once with `mkdocs build --strict` and parse every page."""
    out = tmp_path_factory.mktemp("site")
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    pages = {}
    for path in out.rglob("*.html"):
        parser = _Parser()
        parser.feed(path.read_text(encoding="utf-8"))
        pages[path.relative_to(out).as_posix()] = parser
    return Site(out, pages)


def test_every_public_name_has_an_api_entry(site):
    api_ids = set()
    for page, parser in site.pages.items():
        if page.startswith("api/"):
            api_ids |= parser.ids
    missing = [name for name in public_names() if f"hierax.{name}" not in api_ids]
    assert not missing, f"no API entry for: {missing}"


def test_no_broken_internal_links(site):
    root = site.root
    broken = []
    checked = 0
    for page, parser in site.pages.items():
        if page == "404.html":  # its links are absolute to wherever the site is served
            continue
        for _, value in parser.links:
            url = urllib.parse.urlsplit(value)
            if url.scheme or url.netloc or value.startswith(("mailto:", "data:")):
                continue
            if url.path:
                target = posixpath.normpath(
                    posixpath.join(posixpath.dirname(page), url.path)
                )
                if target.startswith(".."):
                    broken.append((page, value, "outside the site"))
                    continue
                if (root / target).is_dir() or url.path.endswith("/"):
                    target = posixpath.join(target, "index.html")
            else:
                target = page
            if not (root / target).is_file():
                broken.append((page, value, "no such file"))
                continue
            checked += 1
            fragment = urllib.parse.unquote(url.fragment)
            if fragment and target.endswith(".html"):
                if fragment not in site.pages[target].ids:
                    broken.append((page, value, "no such anchor"))
    assert not broken, "broken links:\n" + "\n".join(map(str, broken))
    assert checked > 100  # the parser did find the navigation and cross-references


def test_site_needs_no_network(site):
    """Scripts and stylesheets come from the site itself; math is typeset by the
    vendored KaTeX."""
    root = site.root
    assert (root / "javascripts" / "katex" / "katex.min.js").is_file()
    for page, parser in site.pages.items():
        for attribute, value in parser.links:
            external = urllib.parse.urlsplit(value).scheme in ("http", "https")
            if external and (attribute == "src" or value.endswith(".css")):
                pytest.fail(f"{page} loads {value} from the network")
    index = (root / "index.html").read_text(encoding="utf-8")
    assert 'class="arithmatex"' in index
    assert "javascripts/katex-init.js" in index


def test_examples_are_served_and_embedded(site):
    root = site.root
    for script in (ROOT / "examples").glob("*.py"):
        assert (root / "examples" / script.name).is_file()
    examples = (root / "examples" / "index.html").read_text(encoding="utf-8")
    text = html.unescape(re.sub(r"<[^>]+>", "", examples))  # drop highlighting
    # The sources and outputs are embedded by snippets.
    assert text.count("def main(") == 4
    assert "smallest reduction factor" in text


def _load_hooks():
    spec = importlib.util.spec_from_file_location("hooks", ROOT / "docs" / "hooks.py")
    assert spec is not None and spec.loader is not None
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    return hooks


def test_benchmarks_page_pulls_in_results(tmp_path, monkeypatch):
    """The build hook shows the committed results, else a local run's, else says
    how to produce them."""
    hooks = _load_hooks()
    monkeypatch.setattr(hooks, "BENCHMARKS", tmp_path)
    assert "make bench" in hooks._benchmark_section()

    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "results.md").write_text(
        "# Run\n\n## Compile\n\n| K |\n|---|\n"
    )
    (tmp_path / "out" / "compile_vs_order.png").write_bytes(b"")
    section = hooks._benchmark_section()
    assert section.lstrip().startswith("### Compile")  # under the page's title
    assert "![compile vs order](benchmarks/figures/compile_vs_order.png)" in section

    (tmp_path / "figures").mkdir()
    (tmp_path / "figures" / "compile_time.png").write_bytes(b"")
    (tmp_path / "README.md").write_text(
        "# Benchmarks\n\nIntro.\n\n| K | s |\n|---|---|\n| 9 | 1 |\n\n"
        "![compile](figures/compile_time.png) see [the script](run.py)\n"
    )
    section = hooks._benchmark_section()
    assert section.lstrip().startswith("Intro.")
    assert "![compile](benchmarks/figures/compile_time.png)" in section
    assert "the script (`run.py`)" in section
    assert "compile_vs_order" not in section  # the committed results win


# Pages whose ```python blocks, run in order, form one self-contained script.
RUNNABLE_PAGES = [
    "index.md",
    "pytorch.md",
    "how-to/time-dependent.md",
    "how-to/gradients.md",
    "how-to/batching.md",
    "how-to/precision.md",
    "how-to/recursions.md",
    "api/time-functions.md",
    "api/taylor.md",
]


PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```$", re.MULTILINE | re.DOTALL)


def test_runnable_pages_are_listed():
    """Every page with top-level Python code is run below, except the one that
    quotes the original question's fragment. (Sources embedded with snippets sit
    indented inside admonitions and are run by `tests/test_examples.py`.)"""
    with_code = {
        path.relative_to(ROOT / "docs").as_posix()
        for path in (ROOT / "docs").rglob("*.md")
        if PYTHON_BLOCK.search(path.read_text(encoding="utf-8"))
    }
    assert with_code - {"seed-problem.md"} == set(RUNNABLE_PAGES)


@pytest.mark.parametrize("page", RUNNABLE_PAGES)
def test_code_on_page_runs(page, tmp_path):
    text = (ROOT / "docs" / page).read_text(encoding="utf-8")
    blocks = PYTHON_BLOCK.findall(text)
    assert blocks, page
    script = tmp_path / "page.py"
    script.write_text("\n".join(blocks))
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    env.setdefault("JAX_PLATFORMS", "cpu")
    result = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert result.returncode == 0, f"code on {page} failed:\n{result.stderr}"
