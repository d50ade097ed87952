"""The distribution installs under `draftheads` only, as a wheel too, with its recipes."""

import os
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_wheel_maps_top_level_folders_into_the_package(tmp_path):
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w", str(tmp_path), str(ROOT)],
        check=True, capture_output=True,
    )
    wheel = next(tmp_path.glob("draftheads-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.startswith("draftheads-")}
    assert tops == {"draftheads"}, tops  # nothing under a generic name like `training`
    for expected in ("draftheads/heads/medusa.py", "draftheads/training/target.py", "draftheads/core/tree.py", "draftheads/interop/vllm.py",
                     "draftheads/recipes/eagle-smollm2.yaml", "draftheads/recipes/accelerate/__init__.py",
                     "draftheads/training/prompt_sets/tasks.jsonl"):
        assert expected in names

    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(site), str(wheel)],
                   check=True, capture_output=True)
    code = "import draftheads.heads, draftheads.core.tree; from draftheads.recipe import bundled_recipes, load_recipe; " \
           "print(draftheads.__file__); load_recipe('mtp-smollm2'); " \
           "from draftheads.training.prompts import task_prompts; assert len(task_prompts()) == 80; print(len(bundled_recipes()))"
    env = {**os.environ, "PYTHONPATH": str(site)}
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, check=True)
    first, count = done.stdout.split()
    assert first.startswith(str(site)) and int(count) >= 6
