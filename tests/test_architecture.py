"""The layer order ARCHITECTURE.md writes down, enforced on the source.

Every draftheads import (function-local ones included) goes down the order or stays in its
layer; no modules import each other in a cycle (package __init__ files count as modules); no
function-local import is left outside the modules that import lazily for start-up time; and
`draftheads --help` does not import torch.

    python tests/test_architecture.py [CHECKOUT]    # prints the import graph's counts (any checkout, old layouts too)
"""

import ast
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# folder -> package, as pyproject.toml maps them
FOLDERS = {"draftheads": "draftheads", "core": "draftheads.core", "heads": "draftheads.heads",
           "interop": "draftheads.interop", "training": "draftheads.training", "inference": "draftheads.inference",
           "recipes": "draftheads.recipes"}
# Modules whose function-local imports are there for start-up time: the lazy public API and the CLI's commands.
LAZY = {"draftheads", "draftheads.cli"}


def layer_order() -> list[str]:
    """The packages bottom to top, from ARCHITECTURE.md's 'Layer order, top to bottom:' line."""
    text = (ROOT / "ARCHITECTURE.md").read_text()
    line = re.search(r"^Layer order, top to bottom: (.+)$", text, re.MULTILINE)
    assert line, "ARCHITECTURE.md must state 'Layer order, top to bottom: `a` > `b` > ...'"
    return re.findall(r"`([\w.]+)`", line.group(1))[::-1]


def modules(root: Path = ROOT) -> dict[str, Path]:
    found = {}
    for folder, package in FOLDERS.items():
        for file in sorted((root / folder).glob("*.py")):
            found[package if file.stem == "__init__" else f"{package}.{file.stem}"] = file
    return found


def layer_of(module: str, order: list[str]) -> int:
    """Index in `order` of the deepest listed package holding `module` (the root package holds the rest)."""
    owners = [p for p in order if module == p or module.startswith(p + ".")]
    assert owners, f"{module} is in no layer of ARCHITECTURE.md"
    return order.index(max(owners, key=len))


def imports(file: Path, known: dict) -> list[tuple[str, int, bool]]:
    """(imported draftheads module, line, inside a function) for every import in `file`."""
    tree = ast.parse(file.read_text())
    local = {id(node) for fn in ast.walk(tree) if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
             for node in ast.walk(fn) if isinstance(node, (ast.Import, ast.ImportFrom))}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("draftheads"):
            names = [f"{node.module}.{a.name}" for a in node.names]
            targets = [n for n in names if n in known] or [node.module]
        elif isinstance(node, ast.Import):
            targets = [a.name for a in node.names if a.name.startswith("draftheads")]
        else:
            continue
        # importing draftheads.a.b first runs draftheads.a's __init__ (the root package's runs for everyone)
        parents = {t.rsplit(".", i)[0] for t in targets for i in range(1, t.count(".")) if t.count(".") > 1}
        out += [(t, node.lineno, id(node) in local) for t in [*targets, *sorted(parents - set(targets))]]
    return out


def graph(root: Path = ROOT):
    known = modules(root)
    return known, {name: imports(file, known) for name, file in known.items()}


def test_imports_go_down_the_layer_order():
    order = layer_order()
    assert order[0] == "draftheads.core" and order[-1] == "draftheads"
    known, edges = graph()
    upward = [f"{name}:{line} imports {target}" for name, found in edges.items() for target, line, _ in found
              if target in known and layer_of(target, order) > layer_of(name, order)]
    assert not upward, "imports against the layer order:\n" + "\n".join(upward)


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


def test_function_local_imports_only_where_start_up_time_needs_them():
    _, edges = graph()
    local = [f"{name}:{line} imports {target} inside a function" for name, found in edges.items()
             for target, line, inside in found if inside and name not in LAZY]
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


def report(root: Path) -> None:
    """The counts behind the architecture issue: package-to-package imports, cycles, imports inside functions."""
    import collections

    known, edges = graph(root)
    packages = sorted(FOLDERS.values(), key=len, reverse=True)
    package = {name: next(p for p in packages if name == p or name.startswith(p + ".")) for name in known}
    crossing = {(n, line, package[t]) for n, found in edges.items() for t, line, _ in found if t in known and package[t] != package[n]}
    pairs = collections.Counter((package[n], to) for n, _, to in crossing)
    local = {(n, line) for n, found in edges.items() for _, line, inside in found if inside}
    print("files per package:", dict(sorted(collections.Counter(package.values()).items())))
    print("import statements from one package into another:")
    for (a, b), count in sorted(pairs.items()):
        print(f"  {a} -> {b}: {count}")
    print("import cycles:", len(cycles(known, edges)))
    print("draftheads import statements inside functions:", len(local))


if __name__ == "__main__":
    report(Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else ROOT)
