"""llama.cpp built here from the source the package registry holds: the tree vendored in the `llama-cpp-python` sdist.

    engine = install_llama_cpp()         # built once (CMake, CPU backend), then read from the cache
    engine.server                        # .../bin/llama-server
    draftheads engine install llama.cpp  # the same from the command line, with progress

Nothing prebuilt is fetched: pip downloads the sdist pinned by sha256 (core/registry.py), its `vendor/llama.cpp`
is configured with CMake and `llama-server` compiled. The result is cached under
`$DRAFTHEADS_CACHE/engines/llama.cpp/<version>-<sha256[:12]>-<cpu>/`, keyed by the sdist and the CPU features the
build uses, and published atomically (a killed build leaves only a hidden work folder, removed by the next one).
The folder also keeps the tree's converter (`convert_hf_to_gguf.py`, `conversion/`, `gguf-py/`) and `docs/`.

CPU features: `GGML_NATIVE` (-march=native) is off on x86-64: on some virtual machines it compiled instructions the
hypervisor does not run ("Illegal instruction" at thread-pool start). Each ISA extension /proc/cpuinfo lists is
switched on by name instead (AVX2, FMA, F16C, AVX-512 and its VNNI/VBMI/BF16 parts); AMX stays off, since its tiles
need the kernel's permission.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from draftheads.core.errors import DraftheadsError
from draftheads.core.folders import file_sha256, write_folder
from draftheads.core.registry import download_pinned
from draftheads.core.state_files import read_json
from draftheads.core.targets import cache_dir

SDIST_VERSION = "0.3.36"   # vendors llama.cpp of October 2026: draft-eagle3, the n-gram modes, the converter
SDIST = f"llama-cpp-python=={SDIST_VERSION}"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
PROGRAMS = ("llama-server",)
KEPT_SOURCES = ("convert_hf_to_gguf.py", "conversion", "gguf-py", "docs", "LICENSE")
COMPLETE = ".complete"
# /proc/cpuinfo flag -> the ggml CMake option that compiles for it
X86_OPTIONS = {"sse4_2": "GGML_SSE42", "avx": "GGML_AVX", "avx2": "GGML_AVX2", "fma": "GGML_FMA", "f16c": "GGML_F16C",
               "bmi2": "GGML_BMI2", "avx_vnni": "GGML_AVX_VNNI", "avx512f": "GGML_AVX512",
               "avx512vbmi": "GGML_AVX512_VBMI", "avx512_vnni": "GGML_AVX512_VNNI", "avx512_bf16": "GGML_AVX512_BF16"}
COMMON_OPTIONS = {
    "CMAKE_BUILD_TYPE": "Release", "BUILD_SHARED_LIBS": "OFF",   # self-contained programs: the folder can move
    "LLAMA_BUILD_TESTS": "OFF", "LLAMA_BUILD_EXAMPLES": "OFF", "LLAMA_OPENSSL": "OFF",
    "LLAMA_BUILD_UI": "OFF", "LLAMA_USE_PREBUILT_UI": "OFF",   # the prebuilt web UI would be downloaded
}


@dataclass(frozen=True)
class LlamaCpp:
    """A finished build: its folder, with bin/ and the kept sources."""

    folder: Path

    @property
    def server(self) -> Path:
        return self.folder / "bin" / "llama-server"

    @property
    def converter(self) -> Path:
        return self.folder / "source" / "convert_hf_to_gguf.py"

    @property
    def record(self) -> dict:
        return read_json(self.folder / COMPLETE, "llama.cpp build record", "`draftheads engine install llama.cpp` "
                         "(or the next engine eval) builds it again", required=("programs",))


def cmake_options() -> dict[str, str]:
    """The CMake options of a build for this machine's CPU."""
    options = dict(COMMON_OPTIONS)
    if platform.machine().lower() in ("x86_64", "amd64"):
        flags = cpu_flags()
        options["GGML_NATIVE"] = "OFF"
        options.update({option: "ON" if flag in flags else "OFF" for flag, option in X86_OPTIONS.items()})
    else:
        options["GGML_NATIVE"] = "ON"
    return options


def cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    line = next((line for line in text.splitlines() if line.startswith("flags")), "")
    return set(line.partition(":")[2].split())


def build_folder(options: dict[str, str]) -> Path:
    """Where the build for these options is cached."""
    key = hashlib.sha256(json.dumps(options, sort_keys=True).encode()).hexdigest()[:8]
    return cache_dir() / "engines" / "llama.cpp" / f"{SDIST_VERSION}-{SDIST_SHA256[:12]}-{key}"


def installed_llama_cpp() -> LlamaCpp | None:
    """The cached build for this machine, if it is complete and its programs are the ones it recorded."""
    engine = LlamaCpp(build_folder(cmake_options()))
    if not (engine.folder / COMPLETE).is_file():
        return None
    try:
        programs = engine.record["programs"]
    except DraftheadsError as e:   # our own cache: built again over, but not without a word
        print(f"draftheads: {e}", file=sys.stderr, flush=True)
        return None
    for name, digest in programs.items():
        path = engine.folder / "bin" / name
        if not path.is_file() or file_sha256(path) != digest:
            return None
    return engine if set(PROGRAMS) <= set(programs) else None


def install_llama_cpp(
        progress: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True)) -> LlamaCpp:
    """The cached llama.cpp build for this machine, built first when there is none (a few minutes on 2 cores)."""
    engine = installed_llama_cpp()
    if engine is not None:
        return engine
    options = cmake_options()
    cmake, compiler = check_toolchain()
    final = build_folder(options)
    final.parent.mkdir(parents=True, exist_ok=True)
    for stale in final.parent.glob(".work-*"):   # our own work folders, left by a killed build
        shutil.rmtree(stale, ignore_errors=True)
    work = Path(tempfile.mkdtemp(dir=final.parent, prefix=".work-"))
    try:
        progress(f"draftheads: fetching {SDIST} (the source of llama.cpp) from the package registry")
        source = unpack_llama_cpp(download_pinned(SDIST, SDIST_SHA256, work, source=True), work / "src")
        progress(f"draftheads: building llama.cpp ({', '.join(PROGRAMS)}) with {compiler}, {os.cpu_count()} jobs; "
                 "CPU options "
                 f"{', '.join(k for k, v in options.items() if k.startswith('GGML_') and v == 'ON') or 'native'}")
        seconds = run_build(cmake, source, work / "build", options, progress)

        def fill(tmp: Path) -> None:
            (tmp / "bin").mkdir()
            (tmp / "source").mkdir()
            for name in PROGRAMS:
                shutil.copy2(work / "build" / "bin" / name, tmp / "bin" / name)
            for name in KEPT_SOURCES:
                (shutil.copytree if (source / name).is_dir() else shutil.copy2)(source / name, tmp / "source" / name)
            record = {"sdist": SDIST, "sdist_sha256": SDIST_SHA256, "cmake_options": options, "compiler": compiler,
                      "build_seconds": round(seconds, 1), "jobs": os.cpu_count(),
                      "built": time.strftime("%Y-%m-%d %H:%M:%S"),
                      "programs": {name: file_sha256(tmp / "bin" / name) for name in PROGRAMS}}
            (tmp / COMPLETE).write_text(json.dumps(record, indent=1) + "\n")

        write_folder(final, fill)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    progress(f"draftheads: llama.cpp built in {seconds / 60:.1f} min, cached in {final}")
    return LlamaCpp(final)


def check_toolchain() -> tuple[str, str]:
    """(cmake, C++ compiler) paths; a one-line error naming what to install when either is missing."""
    cmake = shutil.which("cmake")
    compiler = next((c for c in (os.environ.get("CXX"), "c++", "g++", "clang++") if c and shutil.which(c)), None)
    if cmake is None or compiler is None:
        missing = " and ".join(n for n, found in (("cmake", cmake), ("a C++17 compiler", compiler)) if not found)
        raise DraftheadsError(f"building llama.cpp needs {missing}; install them (Debian/Ubuntu: apt install cmake "
                              "g++; or pip install cmake) and run the command again")
    version = subprocess.run([cmake, "--version"], capture_output=True, text=True).stdout
    found = re.search(r"(\d+)\.(\d+)", version)
    if found and (int(found[1]), int(found[2])) < (3, 14):
        raise DraftheadsError(f"building llama.cpp needs cmake 3.14 or newer, found {found[0]}; pip install cmake")
    return cmake, shutil.which(compiler)


def unpack_llama_cpp(sdist: Path, dest: Path) -> Path:
    """Extract the sdist's vendor/llama.cpp tree into `dest`; returns the tree's root."""
    prefix = f"llama_cpp_python-{SDIST_VERSION}/vendor/llama.cpp/"
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(prefix)]
        if not members:
            raise DraftheadsError(f"{sdist.name} holds no {prefix}; it is not the llama-cpp-python source this "
                                  "build expects")
        extract = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}   # no links or paths out of dest
        tar.extractall(dest, members=members, **extract)
    return dest / prefix


def run_build(cmake: str, source: Path, build: Path, options: dict[str, str], progress) -> float:
    """Configure and compile PROGRAMS; returns the seconds it took. A failure names its log."""
    start = time.monotonic()
    log = build.parent / "build.log"
    configure = [cmake, "-S", str(source), "-B", str(build), *[f"-D{k}={v}" for k, v in options.items()]]
    compile_ = [cmake, "--build", str(build), "--parallel", str(os.cpu_count() or 1), "--target", *PROGRAMS]
    with open(log, "w") as out:
        for step in (configure, compile_):
            shown = -10
            process = subprocess.Popen(step, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for line in process.stdout:
                out.write(line)
                percent = re.match(r"\[\s*(\d+)%\]", line)
                if percent and int(percent[1]) >= shown + 10:   # a line every tenth of the way
                    shown = int(percent[1])
                    progress(f"draftheads: building llama.cpp {shown}% ({(time.monotonic() - start) / 60:.1f} min)")
            if process.wait() != 0:
                tail = " | ".join(line.strip() for line in log.read_text().splitlines()[-3:])
                kept = cache_dir() / "engines" / "llama.cpp" / "last-failed-build.log"
                shutil.copyfile(log, kept)
                raise DraftheadsError(f"building llama.cpp failed ({tail[-300:]}); the whole log is in {kept}")
    return time.monotonic() - start
