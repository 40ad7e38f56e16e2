"""PEP 517 backend for python/: builds the _gpubuf extension with the project's
CMake build (target gpubuf_python, libgpubuf-client linked statically) for the
interpreter that runs pip, and packs it into a wheel. Needs no package from an
index, so `pip install ./python` works offline.

- build_wheel: a wheel tagged for this interpreter's ABI and platform
  (cpXY-cpXY[abiflags]-linux_ARCH: the extension uses the full C API and
  links only the C library; the CUDA driver is loaded at run time).
- build_sdist: the source tree the build needs (the whole project: the
  extension builds with its CMake build), with a pyproject.toml at its top
  that points at this backend; `pip install gpubuf-X.tar.gz` builds from it.
- build_editable (PEP 660): builds the extension once into
  python/build-editable/, links it into python/gpubuf/ and installs a .pth
  that puts python/ on sys.path: edits to the Python files take effect at
  once; after a change to C code, run `pip install -e ./python` again.

The version is the CMake project version (CMakeLists.txt), as for the
library, gpubufd and the Debian packages; the extension carries it too
(gpubuf.__version__).

Environment: GPUBUF_CMAKE_ARGS (more configure arguments), GPUBUF_JOBS.
"""
import base64
import hashlib
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tarfile
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
    """cpXY-cpXY<abiflags>-<platform>: the extension is built against this
    interpreter's full (not limited) C API, so it is for this ABI only
    (abiflags: d for a debug build, t for a free-threaded one); its platform
    is the build machine's (linux_x86_64): it links the system's C library,
    so no manylinux promise is made."""
    impl = f"cp{sys.version_info[0]}{sys.version_info[1]}"
    abiflags = getattr(sys, "abiflags", "")
    if not abiflags and hasattr(sys, "gettotalrefcount"):
        abiflags = "d"
    plat = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    return f"{impl}-{impl}{abiflags}-{plat}"


def _metadata(version):
    return (f"Metadata-Version: 2.1\nName: gpubuf\nVersion: {version}\n"
            "Summary: Share GPU (and host) memory between processes through gpubufd\n"
            "Requires-Python: >=3.10\n")


def _build_extension(work, build_type="Release"):
    """Configure and build target gpubuf_python; returns the package folder."""
    if not (ROOT / "CMakeLists.txt").exists():
        raise RuntimeError(f"gpubuf builds from its source tree: {ROOT} has no CMakeLists.txt")
    cmake = shutil.which("cmake")
    if not cmake:
        raise RuntimeError("cmake not found (Debian: cmake; see scripts/deps.sh)")
    args = [cmake, "-S", str(ROOT), "-B", str(work), f"-DCMAKE_BUILD_TYPE={build_type}",
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


def _write_wheel(wheel_directory, files, tag):
    version = _version()
    dist_info = f"gpubuf-{version}.dist-info"
    name = f"gpubuf-{version}-{tag}.whl"
    files = dict(files)
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


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    with tempfile.TemporaryDirectory(prefix="gpubuf-wheel-") as tmp:
        pkg = _build_extension(Path(tmp) / "build")
        files = {}
        for f in sorted(pkg.iterdir()):
            if f.suffix in (".py", ".pyi", ".so") or f.name == "py.typed":
                files[f"gpubuf/{f.name}"] = f.read_bytes()
        if not any(n.endswith(".so") for n in files):
            raise RuntimeError(f"the build left no extension in {pkg}")
        return _write_wheel(wheel_directory, files, _tag())


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    """PEP 660: the extension is built in python/build-editable/ (kept, so a
    second `pip install -e` rebuilds only what changed) and linked into
    python/gpubuf/; the wheel holds a .pth naming python/."""
    work = PY / "build-editable"
    pkg = _build_extension(work, "RelWithDebInfo")
    built = [f for f in pkg.iterdir() if f.name.startswith("_gpubuf") and f.suffix == ".so"]
    if not built:
        raise RuntimeError(f"the build left no extension in {pkg}")
    for f in built:
        link = PY / "gpubuf" / f.name
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(os.path.relpath(f, link.parent))
    files = {"gpubuf_editable.pth": (str(PY) + "\n").encode()}
    return _write_wheel(wheel_directory, files, _tag())


# What an sdist holds: the files the build reads (the whole CMake project:
# the extension is built with it), not build trees, caches or VCS data.
_SDIST_SKIP_DIRS = {".git", "__pycache__", ".gpudeps", ".whl", "build-editable", ".pytest_cache"}


def _sdist_files():
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others",
                              "--exclude-standard"], check=True, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL).stdout
        names = sorted(n for n in out.decode().split("\0") if n and (ROOT / n).is_file())
        if names:
            return names
    except (OSError, subprocess.CalledProcessError):
        pass
    names = []
    for folder, dirs, files in os.walk(ROOT):
        rel = os.path.relpath(folder, ROOT)
        dirs[:] = sorted(d for d in dirs if d not in _SDIST_SKIP_DIRS
                         and not (rel == "." and (d.startswith("build") or d.startswith("obj-"))))
        names += sorted(os.path.normpath(os.path.join(rel, f)) for f in files
                        if not f.endswith((".pyc", ".so")))
    return names


def build_sdist(sdist_directory, config_settings=None):
    """gpubuf-X.tar.gz: the project's sources under gpubuf-X/, with PKG-INFO
    and a pyproject.toml at the top whose backend is this one."""
    version = _version()
    base = f"gpubuf-{version}"
    name = f"{base}.tar.gz"
    pyproject = (PY / "pyproject.toml").read_text().replace(
        'backend-path = ["build_backend"]', 'backend-path = ["python/build_backend"]')
    if "python/build_backend" not in pyproject:
        raise RuntimeError("python/pyproject.toml has no backend-path = [\"build_backend\"]")

    def add(tar, arcname, data, mode=0o644):
        info = tarfile.TarInfo(f"{base}/{arcname}")
        info.size, info.mode, info.mtime = len(data), mode, 1577836800
        tar.addfile(info, io.BytesIO(data))

    with tarfile.open(Path(sdist_directory) / name, "w:gz", format=tarfile.PAX_FORMAT) as tar:
        add(tar, "PKG-INFO", _metadata(version).encode())
        add(tar, "pyproject.toml", pyproject.encode())
        for n in _sdist_files():
            if n in ("PKG-INFO", "pyproject.toml"):
                continue
            p = ROOT / n
            add(tar, n, p.read_bytes(), 0o755 if os.access(p, os.X_OK) else 0o644)
    return name


def get_requires_for_build_sdist(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


def prepare_metadata_for_build_editable(metadata_directory, config_settings=None):
    return prepare_metadata_for_build_wheel(metadata_directory, config_settings)


def get_requires_for_build_wheel(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    dist_info = Path(metadata_directory) / f"gpubuf-{_version()}.dist-info"
    dist_info.mkdir(parents=True, exist_ok=True)
    (dist_info / "METADATA").write_text(_metadata(_version()))
    return dist_info.name
