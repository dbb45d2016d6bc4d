"""The documentation stays true to the code.

- Every public name has a docstring; a function's or class's ``Args:`` section names
  exactly its signature's parameters, in order (a class documents its constructor's), and
  the API pages (docs/api.md, docs/compat.md) have a ``:::`` line for it, so that it is in
  the generated reference.
- Every docstring example (doctest) runs and prints what it says.
- The ``python`` blocks of README.md and docs/*.md run, each page's in order in one
  namespace, as a notebook would. A block that cannot run here says so on the line before
  its fence: ``<!-- not run: why -->``, or ``<!-- requires: module ... -->`` to run it only
  where those modules import.
- The site builds with ``mkdocs build --strict``, and strict mode fails on a broken link
  and on a docstring that documents a parameter the signature lacks.
"""

from __future__ import annotations

import ast
import doctest
import importlib
import importlib.util
import inspect
import io
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from types import ModuleType

import pytest
import torch

import roiops
import roiops.compat

ROOT = Path(__file__).resolve().parents[1]
API_PAGES = [ROOT / "docs" / "api.md", ROOT / "docs" / "compat.md"]
GUIDE_PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# The aliases the public signatures use (roiops.ops exports them beside its internals).
TYPES = ["roiops.ops.BoxesType", "roiops.ops.OutputSize"]
# *args and **kwargs are documented as "*args:" and "**kwargs:".
STARS = {inspect.Parameter.VAR_POSITIONAL: "*", inspect.Parameter.VAR_KEYWORD: "**"}

try:
    import roiops.onnx
except ImportError as error:  # onnxscript or onnx missing
    ONNX: ModuleType | None = None
    NO_ONNX = f"roiops.onnx does not import here: {error}"
else:
    ONNX = roiops.onnx


def public_names() -> list[str]:
    """Every documented name, from the packages' ``__all__`` (and roiops.config's
    attributes), so that a new public name is checked without changing this list."""
    names = ["roiops", "roiops.compat", "roiops.reference", "roiops.onnx"]
    names += [f"roiops.{n}" for n in roiops.__all__]
    names += [f"roiops.config.{n}" for n, v in vars(roiops.config).items()
              if not n.startswith("_") and not isinstance(v, ModuleType)]
    for n in roiops.compat.__all__:
        names.append(f"roiops.compat.{n}")
        member = getattr(roiops.compat, n)
        if isinstance(member, ModuleType):
            names += [f"{member.__name__}.{m}" for m in member.__all__]
    if ONNX is not None:
        names += [f"roiops.onnx.{n}" for n in ONNX.__all__]
    return names + TYPES


NAMES = public_names()


def resolve(name: str) -> object:
    try:
        return importlib.import_module(name)
    except ImportError:
        module, _, attr = name.rpartition(".")
        return getattr(importlib.import_module(module), attr)


def is_attribute(obj: object) -> bool:
    """A module-level value documented by the string literal after its assignment."""
    return not (isinstance(obj, ModuleType) or inspect.isclass(obj) or inspect.isroutine(obj))


def attribute_docstring(module: ModuleType, name: str) -> str | None:
    """The string literal right after ``name``'s assignment in ``module``'s source, or in the
    module it is imported from."""
    tree = ast.parse(inspect.getsource(module))
    for node, after in zip(tree.body, tree.body[1:]):
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            text = after.value.value if isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant) else None
            return inspect.cleandoc(text) if isinstance(text, str) else None
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and any(a.name == name and a.asname is None for a in node.names):
            source = importlib.import_module("." * node.level + (node.module or ""), module.__package__)
            return attribute_docstring(source, name)
    return None


def docstring(name: str) -> str | None:
    obj = resolve(name)
    if is_attribute(obj):
        module, _, attr = name.rpartition(".")
        return attribute_docstring(importlib.import_module(module), attr)
    return inspect.getdoc(obj) if obj.__doc__ else None


def documented_args(doc: str) -> list[str] | None:
    """The names in a Google-style ``Args:`` section, in order; None without one."""
    lines = doc.splitlines()
    start = next((i for i, line in enumerate(lines) if re.fullmatch(r"\s*(Args|Arguments|Parameters):\s*", line)),
                 None)
    if start is None:
        return None
    header = len(lines[start]) - len(lines[start].lstrip())
    names: list[str] = []
    entry_indent = None
    for line in lines[start + 1:]:
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        if indent <= header:
            break
        entry_indent = entry_indent if entry_indent is not None else indent
        if indent == entry_indent:
            match = re.match(r"(\*{0,2}\w+)\s*(\([^)]*\))?:", line.strip())
            assert match, f"not an Args entry: {line.strip()!r}"
            names.append(match.group(1))
    return names


def parameters(function: object, skip_first: bool = False) -> list[str]:
    params = list(inspect.signature(function).parameters.values())  # type: ignore[arg-type]
    return [STARS.get(p.kind, "") + p.name for p in params[skip_first:]]


def own_methods(cls: type) -> list[tuple[str, object]]:
    """The functions defined in the class body itself (not inherited, not assigned)."""
    return [(n, f) for n, f in vars(cls).items()
            if inspect.isfunction(f) and f.__qualname__.startswith(cls.__qualname__ + ".")]


def has_python_init(cls: type) -> bool:
    return inspect.isfunction(inspect.unwrap(cls.__init__))  # type: ignore[misc]


def needs(name: str) -> list[pytest.MarkDecorator]:
    if name.startswith("roiops.onnx") and ONNX is None:
        return [pytest.mark.skip(reason=NO_ONNX)]
    return []


PARAMS = [pytest.param(n, id=n, marks=needs(n)) for n in NAMES]


@pytest.mark.parametrize("name", PARAMS)
def test_docstring_names_the_signature(name):
    doc = docstring(name)
    assert doc and doc.strip(), f"{name} has no docstring"
    assert not re.search(r":(func|class|mod|meth|attr):`", doc), \
        f"{name}: a Sphinx role, which the site shows as is; link as [`name`][roiops.name]"
    assert not re.search(r"\]\([^)]*\.md\b", doc), \
        f"{name}: a link to a page, which mkdocs does not check in docstrings; name the page in words"
    obj = resolve(name)
    checks: list[tuple[str, str, list[str]]] = []
    if inspect.isroutine(obj):
        checks.append((name, doc, parameters(obj)))
    elif inspect.isclass(obj):
        checks.append((name, doc, parameters(obj) if has_python_init(obj) else []))
        for method, function in own_methods(obj):
            method_doc = inspect.cleandoc(function.__doc__ or "")  # its own, not an inherited one
            if method_doc and documented_args(method_doc) is not None:
                checks.append((f"{name}.{method}", method_doc, parameters(function, skip_first=True)))
    for what, text, expected in checks:
        args = documented_args(text)
        if expected or args is not None:
            assert args == expected, f"{what}: Args: {args}, signature: {expected}"


def directives() -> set[str]:
    return {m for page in API_PAGES for m in re.findall(r"^::: ([\w.]+)\s*$", page.read_text(), re.MULTILINE)}


@pytest.mark.parametrize("name", PARAMS)
def test_api_pages_render_it(name):
    if name.rpartition(".")[0] == "roiops.config":
        assert "roiops.config" in directives()  # its directive renders its attributes
    else:
        assert name in directives(), f"no '::: {name}' line in docs/api.md or docs/compat.md"


# ---- docstring examples


def doctests(name: str) -> list[doctest.DocTest]:
    obj = resolve(name)
    finder, parser = doctest.DocTestFinder(recurse=False), doctest.DocTestParser()
    if is_attribute(obj):
        text = docstring(name) or ""
        return [parser.get_doctest(text, {}, name, None, 0)] if ">>>" in text else []
    objects = [(name, obj)]
    if inspect.isclass(obj):
        objects += [(f"{name}.{n}", f) for n, f in own_methods(obj)]
    return [test for n, o in objects for test in finder.find(o, n, module=False)]


@pytest.mark.parametrize("name", PARAMS)
def test_docstring_examples_run(name):
    switches = dict(vars(roiops.config))
    out = io.StringIO()
    runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE | doctest.ELLIPSIS)
    try:
        for test in doctests(name):
            test.globs = {"torch": torch, "roiops": roiops}
            with torch.random.fork_rng(devices=[]):  # seeded here, the other tests' state kept
                torch.manual_seed(0)
                runner.run(test, out=out.write)
    finally:
        vars(roiops.config).update(switches)  # an example may set a switch
    assert runner.failures == 0, out.getvalue()


# ---- the Python blocks of README.md and docs/*.md

FENCE = re.compile(r"^```python\s*$")
MARK = re.compile(r"^<!-- (not run|requires): (.+?) -->$")


def code_blocks(page: Path) -> list[tuple[int, str, str | None]]:
    """``(line, code, why not run)`` of each ```python block of the page, in order."""
    lines = page.read_text().splitlines()
    blocks = []
    i = 0
    while i < len(lines):
        if FENCE.match(lines[i]):
            end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith("```")), None)
            if end is None:
                raise ValueError(f"{page.name}:{i + 1}: a ```python block with no closing fence")
            mark = MARK.match(lines[i - 1]) if i else None
            why = None
            if mark and mark.group(1) == "not run":
                why = mark.group(2)
            elif mark:
                missing = [m for m in mark.group(2).split() if importlib.util.find_spec(m) is None]
                why = f"needs {', '.join(missing)}" if missing else None
            blocks.append((i + 1, "\n".join(lines[i + 1:end]), why))
            i = end
        i += 1
    return blocks


PAGES = [pytest.param(p, id=str(p.relative_to(ROOT))) for p in GUIDE_PAGES if code_blocks(p)]


def test_unrun_blocks_say_why():
    for page in GUIDE_PAGES:
        for n, line in enumerate(page.read_text().splitlines()):
            if line.startswith("<!--") and ("not run" in line or "requires" in line):
                assert MARK.match(line), f"{page.name}:{n + 1}: write <!-- not run: why --> or <!-- requires: module -->"


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:FutureWarning")
@pytest.mark.parametrize("page", PAGES)
def test_page_code_runs(page, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # where the examples write their files
    namespace = {"torch": torch, "roiops": roiops, "__name__": "__docs__"}
    switches = dict(vars(roiops.config))
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            for line, code, why in code_blocks(page):
                if why is None:
                    try:
                        exec(compile(code, f"{page.name}:{line}", "exec"), namespace)
                    except Exception as error:
                        raise AssertionError(f"the block at {page.name}:{line} fails: {error!r}") from error
    finally:
        vars(roiops.config).update(switches)
        if "torch._dynamo" in sys.modules:  # a page may compile: leave no compiled code behind
            torch._dynamo.reset()


# ---- the site

MKDOCS = ["mkdocs", "mkdocstrings", "mkdocstrings_handlers.python", "material"]


def needs_mkdocs() -> None:
    missing = [m for m in MKDOCS if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"the site needs mkdocs, mkdocs-material and mkdocstrings-python ({', '.join(missing)} missing)")


def mkdocs_build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # without Material's notice on stderr
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config),
                           "--site-dir", str(site)], cwd=config.parent, env=env, capture_output=True, text=True,
                          timeout=300)


def test_site_builds_strictly(tmp_path):
    needs_mkdocs()
    result = mkdocs_build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "WARNING" not in result.stderr, result.stderr
    assert (tmp_path / "site" / "api" / "index.html").exists()


def test_strict_mode_fails_on_a_broken_link_and_an_unknown_parameter(tmp_path):
    """The site's settings (strict, link validation, the docstring checks) with one page
    that links to a missing page and renders a docstring documenting a parameter its
    function lacks: the build fails, naming both."""
    needs_mkdocs()
    import yaml  # mkdocs' own dependency

    settings = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    for key in ("hooks", "exclude_docs", "nav"):
        settings.pop(key, None)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "index.md").write_text("# Page\n\nSee [the missing page](missing.md).\n\n::: drifted.pool\n")
    (tmp_path / "drifted.py").write_text(textwrap.dedent('''\
        def pool(input, size):
            """Pools.

            Args:
                input: the map.
                output_size: renamed since.
            """
        '''))
    config = tmp_path / "mkdocs.yml"
    config.write_text(yaml.safe_dump(settings))
    result = mkdocs_build(config, tmp_path / "site")
    log = result.stdout + result.stderr
    assert result.returncode != 0, log
    assert "missing.md" in log, log
    assert "Parameter 'output_size' does not appear in the function signature" in log, log
