"""PEP 517 backend for python/: builds the _gpubuf extension with the project's
CMake build (target gpubuf_python, libgpubuf-client linked statically) for the
interpreter that runs pip, and packs it into a wheel. Needs no package from an
index, so `pip install ./python` works offline.

Environment: GPUBUF_CMAKE_ARGS (more configure arguments), GPUBUF_JOBS.
"""
import base64
import hashlib
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PY = ROOT / "python"


def _version():
    m = re.search(r"project\(gpubuf VERSION ([0-9.]+)", (ROOT / "CMakeLists.txt").read_text())
    if not m:
        raise RuntimeError(f"no project version in {ROOT / 'CMakeLists.txt'}")
    return m.group(1)


def _tag():
    impl = f"cp{sys.version_info[0]}{sys.version_info[1]}"
    abi = impl + ("d" if hasattr(sys, "gettotalrefcount") else "")
    plat = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    return f"{impl}-{abi}-{plat}"


def _metadata(version):
    return (f"Metadata-Version: 2.1\nName: gpubuf\nVersion: {version}\n"
            "Summary: Share GPU (and host) memory between processes through gpubufd\n"
            "Requires-Python: >=3.10\n")


def _build_extension(work):
    """Configure and build target gpubuf_python; returns the package folder."""
    if not (ROOT / "CMakeLists.txt").exists():
        raise RuntimeError(f"gpubuf builds from its source tree: {ROOT} has no CMakeLists.txt")
    cmake = shutil.which("cmake")
    if not cmake:
        raise RuntimeError("cmake not found (Debian: cmake; see scripts/deps.sh)")
    args = [cmake, "-S", str(ROOT), "-B", str(work), "-DCMAKE_BUILD_TYPE=Release",
            "-DGPUBUF_WITH_PYTHON=ON", f"-DPython3_EXECUTABLE={sys.executable}",
            "-DGPUBUF_BUILD_TESTS=OFF", "-DGPUBUF_BUILD_BENCH=OFF", "-DGPUBUF_BUILD_MAN=OFF"]
    if shutil.which("ninja"):
        args += ["-G", "Ninja"]
    args += shlex.split(os.environ.get("GPUBUF_CMAKE_ARGS", ""))
    jobs = os.environ.get("GPUBUF_JOBS", str(os.cpu_count() or 1))
    for cmd in (args, [cmake, "--build", str(work), "--target", "gpubuf_python", "-j", jobs]):
        print("gpubuf_build:", " ".join(cmd), file=sys.stderr)
        subprocess.run(cmd, check=True, stdout=sys.stderr)
    return work / "python" / "gpubuf"


def _record_line(name, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    version = _version()
    tag = _tag()
    dist_info = f"gpubuf-{version}.dist-info"
    name = f"gpubuf-{version}-{tag}.whl"
    with tempfile.TemporaryDirectory(prefix="gpubuf-wheel-") as tmp:
        pkg = _build_extension(Path(tmp) / "build")
        files = {}
        for f in sorted(pkg.iterdir()):
            if f.suffix in (".py", ".pyi", ".so") or f.name == "py.typed":
                files[f"gpubuf/{f.name}"] = f.read_bytes()
        if not any(n.endswith(".so") for n in files):
            raise RuntimeError(f"the build left no extension in {pkg}")
        files[f"{dist_info}/METADATA"] = _metadata(version).encode()
        files[f"{dist_info}/WHEEL"] = (f"Wheel-Version: 1.0\nGenerator: gpubuf_build\n"
                                       f"Root-Is-Purelib: false\nTag: {tag}\n").encode()
        record = [_record_line(n, d) for n, d in files.items()] + [f"{dist_info}/RECORD,,"]
        files[f"{dist_info}/RECORD"] = ("\n".join(record) + "\n").encode()
        with zipfile.ZipFile(Path(wheel_directory) / name, "w", zipfile.ZIP_DEFLATED) as z:
            for n, d in files.items():
                info = zipfile.ZipInfo(n, date_time=(2020, 1, 1, 0, 0, 0))
                info.external_attr = (0o755 if n.endswith(".so") else 0o644) << 16
                info.compress_type = zipfile.ZIP_DEFLATED
                z.writestr(info, d)
    return name


def get_requires_for_build_wheel(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    dist_info = Path(metadata_directory) / f"gpubuf-{_version()}.dist-info"
    dist_info.mkdir(parents=True, exist_ok=True)
    (dist_info / "METADATA").write_text(_metadata(_version()))
    return dist_info.name
