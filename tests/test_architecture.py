"""The layer order ARCHITECTURE.md writes down, enforced on the source.

Every draftheads import (function-local ones included) goes down the order or stays in its package;
packages on one level never import each other; a sub-package (heads/parts/) imports nothing of its package
outside it; no modules import each other in a cycle (package __init__ files count as modules); function-local
imports of draftheads modules stay in the modules that import lazily for start-up time, and of third-party
packages in the short list ARCHITECTURE.md gives; and `draftheads --help` does not import torch. The folder
tree under draftheads/ is the import tree, so modules are found by walking it. No line of the Python files under
draftheads/, benchmarks/, tests/ and tools/ is longer than LINE_LENGTH characters.

Outside the package (OUTSIDE_RULES): benchmarks/ is a package above draftheads, run as `python -m benchmarks.NAME`;
it imports draftheads, its own modules by their full names and, of the tests, only tests.fixtures, which imports
nothing of tests or benchmarks. Tests import benchmarks as modules; draftheads imports none of them. tools/ (scripts
that build shipped data) imports only draftheads; benchmarks/peer_runners/ runs in another venv and imports nothing
of ours. Nowhere is sys.path edited or a file loaded as a module by its path.

    python tests/test_architecture.py [CHECKOUT]    # prints the import graph's counts
"""

import ast
import collections
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINE_LENGTH = 120  # pyproject.toml's [tool.ruff] line-length
OURS = ("draftheads", "benchmarks", "tests", "tools")
# importer (the longest prefix that holds it) -> what of OURS it may import: a top-level name allows all of it
OUTSIDE_RULES = {
    "draftheads": {"draftheads"},
    "benchmarks": {"draftheads", "benchmarks", "tests.fixtures"},
    "benchmarks.peer_runners": set(),
    "tests": {"draftheads", "tests", "benchmarks"},
    "tests.fixtures": {"draftheads"},
    "tools": {"draftheads"},
}
# what loads a file as a module by its path, beside editing sys.path
PATH_LOADERS = {"spec_from_file_location", "module_from_spec", "SourceFileLoader", "runpy"}


def architecture(root: Path = ROOT) -> str:
    return (root / "ARCHITECTURE.md").read_text()


def layer_levels(root: Path = ROOT) -> list[list[str]]:
    """The packages' levels bottom to top, from the 'Layer order, top to bottom:' line: levels are separated by
    '>', the packages of one level by '|'."""
    line = re.search(r"^Layer order, top to bottom: (.+)$", architecture(root), re.MULTILINE)
    assert line, "ARCHITECTURE.md must state 'Layer order, top to bottom: `a` > `b` | `c` > ...'"
    return [re.findall(r"`([\w.]+)`", level) for level in line.group(1).split(">")][::-1]


def listed(root: Path, heading: str) -> set[str]:
    """The `names` on ARCHITECTURE.md's line that starts with `heading`."""
    line = re.search(rf"^{re.escape(heading)}(.+)$", architecture(root), re.MULTILINE)
    assert line, f"ARCHITECTURE.md must have a line starting '{heading}'"
    return set(re.findall(r"`([\w.]+)`", line.group(1)))


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Module name -> file for every .py file under draftheads/ (a package is its __init__.py)."""
    found = {}
    for file in sorted((root / "draftheads").rglob("*.py")):
        parts = file.relative_to(root).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = file
    return found


def layer_of(module: str, levels: list[list[str]]) -> tuple[int, str]:
    """(level, package) of the deepest listed package holding `module`; `__main__` modules are command-line
    entry points and belong with the root package."""
    if module.endswith(".__main__"):
        module = "draftheads"
    owners = [(i, p) for i, level in enumerate(levels) for p in level if module == p or module.startswith(p + ".")]
    assert owners, f"{module} is in no layer of ARCHITECTURE.md"
    return max(owners, key=lambda owner: len(owner[1]))


def imports(file: Path, known: dict) -> list[tuple[str, int, bool]]:
    """(imported module, line, inside a function) for every import in `file`: draftheads modules by their full
    name, third-party ones by their top-level name."""
    tree = ast.parse(file.read_text())
    local = {id(node) for fn in ast.walk(tree) if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
             for node in ast.walk(fn) if isinstance(node, (ast.Import, ast.ImportFrom))}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{a.name}" for a in node.names]
            targets = [n for n in names if n in known] or [node.module]
        elif isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        else:
            continue
        ours = [t for t in targets if t.startswith("draftheads")]
        # importing draftheads.a.b first runs draftheads.a's __init__ (the root package's runs for everyone)
        parents = {t.rsplit(".", i)[0] for t in ours for i in range(1, t.count(".")) if t.count(".") > 1}
        theirs = {t.split(".")[0] for t in targets if not t.startswith("draftheads")}
        out += [(t, node.lineno, id(node) in local) for t in [*ours, *sorted(parents - set(ours)), *sorted(theirs)]]
    return out


def graph(root: Path = ROOT):
    known = modules(root)
    return known, {name: imports(file, known) for name, file in known.items()}


def test_imports_go_down_the_layer_order():
    levels = layer_levels()
    assert levels[0] == ["draftheads.core"] and levels[-1] == ["draftheads"]
    known, edges = graph()
    wrong = []
    for name, found in edges.items():
        level, package = layer_of(name, levels)
        for target, line, _ in found:
            if target not in known:
                continue
            to_level, to_package = layer_of(target, levels)
            if to_level > level or (to_level == level and to_package != package):
                wrong.append(f"{name}:{line} imports {target} ({to_package} is not below {package})")
    assert not wrong, "imports against the layer order:\n" + "\n".join(wrong)


def test_every_package_is_in_a_layer():
    levels = layer_levels()
    packages = {name for name, file in modules().items() if file.name == "__init__.py"}
    layered = {p for level in levels for p in level}
    unlisted = sorted(p for p in packages if p not in layered and p.count(".") == 1 and p != "draftheads.recipes")
    assert not unlisted, f"packages missing from ARCHITECTURE.md's layer order: {unlisted}"


def test_sub_packages_import_nothing_of_their_package_outside_them():
    """A sub-package of a listed package (heads/parts/) holds what its package's modules share: it imports none of
    them (its package's __init__ aside, which importing the sub-package runs)."""
    known, edges = graph()
    subs = [name for name, file in known.items() if file.name == "__init__.py" and name.count(".") > 1]
    wrong = [f"{name}:{line} imports {target}" for sub in subs for name, found in edges.items()
             if name == sub or name.startswith(sub + ".") for target, line, _ in found
             if target in known and target.startswith(sub.rsplit(".", 1)[0] + ".")
             and not (target == sub or target.startswith(sub + "."))]
    assert not wrong, "a sub-package imports a module of its package outside it:\n" + "\n".join(wrong)


def cycles(known: dict, edges: dict) -> list[str]:
    """Every import cycle found by a depth-first walk, as 'a -> b -> a'."""
    following = {name: {t for t, _, _ in found if t in known and t != name} for name, found in edges.items()}
    state, path, found_cycles = {}, [], []

    def visit(node):
        state[node] = "open"
        path.append(node)
        for nxt in sorted(following[node]):
            if state.get(nxt) == "open":
                found_cycles.append(" -> ".join(path[path.index(nxt):] + [nxt]))
            elif nxt not in state:
                visit(nxt)
        path.pop()
        state[node] = "done"

    for node in sorted(following):
        if node not in state:
            visit(node)
    return found_cycles


def test_no_import_cycles():
    found = cycles(*graph())
    assert not found, "import cycles:\n" + "\n".join(found)


def test_function_local_imports_only_where_documented():
    lazy = listed(ROOT, "Modules that import draftheads lazily: ")
    allowed = listed(ROOT, "Third-party packages imported where they are used: ")
    _, edges = graph()
    local = [f"{name}:{line} imports {target} inside a function" for name, found in edges.items()
             for target, line, inside in found
             if inside and (name not in lazy if target.startswith("draftheads") else
                            target not in allowed and target not in sys.stdlib_module_names)]
    assert not local, "\n".join(local)


def test_help_does_not_import_torch():
    code = ("import sys, contextlib, io\nfrom draftheads.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()) as out:\n"
            "    try:\n        main(['--help'])\n    except SystemExit:\n        pass\n"
            "assert 'usage: draftheads' in out.getvalue()\n"
            "heavy = sorted(m for m in ('torch', 'transformers', 'accelerate', 'datasets') if m in sys.modules)\n"
            "assert not heavy, heavy\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_no_line_is_longer_than_120_characters():
    long = [f"{file.relative_to(ROOT)}:{number}" for folder in OURS
            for file in sorted((ROOT / folder).rglob("*.py"))
            for number, line in enumerate(file.read_text(encoding="utf-8").splitlines(), 1) if len(line) > LINE_LENGTH]
    assert not long, f"lines longer than {LINE_LENGTH} characters:\n" + "\n".join(long)


def test_no_source_file_is_ignored_by_git():
    """A source file that .gitignore hides works here and is missing from every clone (`data/` once hid
    draftheads/data/). Where there is no git checkout (an unpacked sdist) there is nothing to check."""
    if not (ROOT / ".git").exists():
        return
    done = subprocess.run(["git", "ls-files", "--others", "--ignored", "--exclude-standard", *OURS], cwd=ROOT,
                          capture_output=True, text=True, check=True)
    hidden = [f for f in done.stdout.splitlines() if f.endswith((".py", ".yaml", ".jsonl", ".md"))]
    assert not hidden, f"source files .gitignore hides from every clone: {hidden}"


def outside_modules(root: Path = ROOT) -> dict[str, Path]:
    """Module name -> file for every .py file under benchmarks/, tests/ and tools/, as `python -m` names it."""
    found = {}
    for folder in OURS[1:]:
        for file in sorted((root / folder).rglob("*.py")):
            parts = file.relative_to(root).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = file
    return found


def named_imports(file: Path, known: set[str]) -> list[tuple[str, int]]:
    """(imported module, line) for every import in `file`, function-local ones included: a known module by its full
    name, anything else as written; a relative import as its dots."""
    out = []
    for node in ast.walk(ast.parse(file.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            out.append(("." * node.level + (node.module or ""), node.lineno))
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [f"{node.module}.{a.name}" for a in node.names]
            out += [(n, node.lineno) for n in [n for n in names if n in known] or [node.module]]
        elif isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names]
    return out


def outside_import_problem(importer: str, target: str, known: set[str], bare: set[str]) -> str | None:
    """Why `importer` may not import `target` under OUTSIDE_RULES, or None."""
    if target.startswith("."):
        return "a relative import (name the module in full)"
    if target.split(".")[0] in bare:
        return "a module of ours by its bare name (name it in full: benchmarks.NAME, tests.NAME)"
    if target.split(".")[0] not in OURS:
        return None
    rule = max((r for r in OUTSIDE_RULES if importer == r or importer.startswith(r + ".")), key=len)
    if not any(target == a or target.startswith(a + ".") for a in OUTSIDE_RULES[rule]):
        allowed = ", ".join(sorted(OUTSIDE_RULES[rule])) or "nothing"
        return f"a {rule} module imports {allowed} of ours"
    if target.startswith(("benchmarks", "tests", "tools")) and (target not in known or "peer_runners" in target):
        return "no module of the package (peer_runners/ holds scripts run in another venv)"
    return None


def test_benchmarks_tests_and_tools_import_by_the_outside_rules():
    outside = outside_modules()
    known = set(outside)
    bare = {f.stem for f in outside.values()} - {"__init__", "conftest"}
    files = {**modules(), **outside}
    wrong = [f"{name}:{line} imports {target}: {problem}" for name, file in files.items()
             for target, line in named_imports(file, known)
             if (problem := outside_import_problem(name, target, known, bare))]
    assert not wrong, "imports against the outside rules:\n" + "\n".join(wrong)


def path_hacks(file: Path) -> list[tuple[int, str]]:
    """(line, name) for every use of sys.path in `file`, and of what loads a file as a module by its path."""
    found = []
    for node in ast.walk(ast.parse(file.read_text())):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "sys":
            names = {"sys.path"} if node.attr == "path" else set()
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names = {a.name for a in node.names} & PATH_LOADERS
        else:
            names = {getattr(node, "attr", None) or getattr(node, "id", None)} & PATH_LOADERS
        found += [(node.lineno, name) for name in sorted(names)]
    return found


def test_no_sys_path_edits_and_no_files_loaded_by_path():
    found = [f"{file.relative_to(ROOT)}:{line} {name}" for folder in OURS
             for file in sorted((ROOT / folder).rglob("*.py")) for line, name in path_hacks(file)]
    assert not found, "sys.path used or a file loaded by its path (import it as a module):\n" + "\n".join(found)


def report(root: Path) -> None:
    """The counts behind the architecture issue: package-to-package imports, cycles, imports inside functions."""
    known, edges = graph(root)
    packages = sorted({n for n, f in known.items() if f.name == "__init__.py"}, key=len, reverse=True)
    package = {name: next(p for p in packages if name == p or name.startswith(p + ".")) for name in known}
    crossing = {(n, line, package[t]) for n, found in edges.items() for t, line, _ in found
                if t in known and package[t] != package[n]}
    pairs = collections.Counter((package[n], to) for n, _, to in crossing)
    print("files per package:", dict(sorted(collections.Counter(package.values()).items())))
    print("import statements from one package into another:")
    for (a, b), count in sorted(pairs.items()):
        print(f"  {a} -> {b}: {count}")
    print("import cycles:", len(cycles(known, edges)))
    for kind, mine in (("draftheads", True), ("third-party", False)):
        inside = {(n, line) for n, found in edges.items() for t, line, local in found
                  if local and t.startswith("draftheads") == mine and t.split(".")[0] not in sys.stdlib_module_names}
        print(f"{kind} import statements inside functions:", len(inside))


if __name__ == "__main__":
    report(Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else ROOT)
