"""The distribution installs under `draftheads` only, as a wheel too, with its recipes."""

import os
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_wheel_installs_the_package_tree(tmp_path):
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w", str(tmp_path),
         str(ROOT)],
        check=True, capture_output=True,
    )
    wheel = next(tmp_path.glob("draftheads-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.startswith("draftheads-")}
    assert tops == {"draftheads"}, tops  # nothing under a generic name like `training`
    for expected in ("draftheads/heads/medusa.py", "draftheads/data/target.py", "draftheads/decoding/generate.py",
                     "draftheads/evaluation/evaluate.py", "draftheads/core/tree.py", "draftheads/interop/vllm.py",
                     "draftheads/recipes/eagle-smollm2.yaml", "draftheads/recipes/accelerate/__init__.py",
                     "draftheads/data/prompt_sets/tasks.jsonl", "draftheads/data/prompt_sets/long.jsonl"):
        assert expected in names

    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(site), str(wheel)],
                   check=True, capture_output=True)
    code = ("import draftheads.heads, draftheads.core.tree; "
            "from draftheads.recipe import bundled_recipes, load_recipe; "
            "print(draftheads.__file__); load_recipe('mtp-smollm2'); "
            "from draftheads.data.prompt_tables import task_prompts; assert len(task_prompts()) == 80; "
            "print(len(bundled_recipes()))")
    env = {**os.environ, "PYTHONPATH": str(site)}
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          check=True)
    first, count = done.stdout.split()
    assert first.startswith(str(site)) and int(count) >= 6


def test_every_third_party_import_is_a_declared_dependency():
    """What the package imports (at the top of a module or inside a function) is installed by `pip install draftheads`,
    or by the extra of the one optional feature that needs it."""
    import ast
    import importlib.metadata
    import re

    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = {re.split(r"[<>=!~\[; ]", req)[0].lower().replace("_", "-") for req in project["dependencies"]}
    optional = {re.split(r"[<>=!~\[; ]", req)[0].lower().replace("_", "-")
                for reqs in project["optional-dependencies"].values() for req in reqs}
    owners = importlib.metadata.packages_distributions()
    imported = set()
    for file in (ROOT / "draftheads").rglob("*.py"):
        for node in ast.walk(ast.parse(file.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else [])
            imported.update(name.split(".")[0] for name in names)
    third_party = sorted(m for m in imported if m not in sys.stdlib_module_names and m != "draftheads")
    missing = [m for m in third_party
               if not {d.lower().replace("_", "-") for d in owners.get(m, [m])} & (declared | optional)]
    assert not missing, f"imported but not declared in pyproject.toml: {missing}"
    assert "wandb" not in declared and "wandb" in optional   # an optional tracker, not a requirement
    assert any(req.startswith("transformers") and "<" in req for req in project["dependencies"])
