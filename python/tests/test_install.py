"""pip install ./python into a fresh virtual environment, with no package index:
the in-tree build backend needs nothing from one. Also from its source
distribution (build_sdist), in editable mode (build_editable, PEP 660), the
wheel's tags, and the one version (CMakeLists.txt) everything carries."""
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile

import pytest

from conftest import SRC

pytestmark = pytest.mark.install

# No NumPy here: the venv of a venv does not see the outer one's packages.
SCRIPT = r"""
import sys, gpubuf
assert gpubuf.__file__.startswith(sys.prefix), gpubuf.__file__
with gpubuf.Client(sys.argv[1]) as c:
    b = c.alloc(1024, "venv/check")
    memoryview(b)[:] = b"\x09" * 1024
    b.seal(sync=True)
    with c.open("venv/check") as o:
        assert o.to_pybytes() == b"\x09" * 1024
    b.release()
    print("venv ok", gpubuf.__version__, c.stat("venv/check")["state"])
"""


def _venv(tmp_path):
    """A fresh virtual environment (python, env) and a copy of the source tree:
    pip builds in the tree, which must stay untouched whatever it leaves."""
    if subprocess.run([sys.executable, "-c", "import ensurepip"]).returncode != 0:
        if sys.executable.startswith("/usr/bin/"):  # Debian's: scripts/deps.sh installs it
            pytest.fail(f"{sys.executable} has no ensurepip (Debian: python3-venv)")
        pytest.skip(f"{sys.executable} has no ensurepip: cannot make a virtual environment")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1", GPUBUF_JOBS="2")
    src = tmp_path / "src"

    def skip(folder, names):  # build trees and caches of the checkout
        top = os.path.samefile(folder, SRC)
        return [n for n in names if n in (".git", "__pycache__", ".gpudeps", ".whl",
                                          "build-editable")
                or (top and (n.startswith("build") or n.startswith("obj-")))
                or (n.startswith("_gpubuf") and n.endswith(".so"))]

    shutil.copytree(SRC, src, ignore=skip, symlinks=True)
    return venv / "bin" / "python", env, src


def _cmake_version():
    import re
    text = open(os.path.join(SRC, "CMakeLists.txt")).read()
    return re.search(r"project\(gpubuf VERSION ([0-9.]+)", text).group(1)


def _run(py, env, cwd, *args):
    return subprocess.run([str(py), *args], env=env, check=True, stdout=subprocess.PIPE,
                          text=True, cwd=cwd).stdout


def test_pip_install_into_a_venv(tmp_path, daemon):
    py, env, src = _venv(tmp_path)
    r = subprocess.run([str(py), "-m", "pip", "install", "--no-index", str(src / "python")],
                       env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert r.returncode == 0, r.stdout[-4000:]
    out = subprocess.run([str(py), "-c", SCRIPT, daemon.socket], env=env, check=True,
                         stdout=subprocess.PIPE, text=True, cwd=tmp_path).stdout
    assert out.startswith("venv ok") and out.strip().endswith("sealed")
    site = subprocess.run([str(py), "-c", "import gpubuf, os; print(os.path.dirname(gpubuf.__file__))"],
                          env=env, check=True, stdout=subprocess.PIPE, text=True,
                          cwd=tmp_path).stdout.strip()
    assert sorted(f for f in os.listdir(site) if f != "__pycache__")[:4] == [
        "__init__.py", "__init__.pyi", "_aio.py", "_gpubuf" + sysconfig.get_config_var("EXT_SUFFIX")]
    assert os.path.exists(os.path.join(site, "py.typed"))
    assert os.path.exists(os.path.join(site, "torch.py"))  # gpubuf.torch (docs/torch.md)
    # Uninstalls cleanly too.
    subprocess.run([str(py), "-m", "pip", "uninstall", "-y", "gpubuf"], env=env, check=True,
                   stdout=subprocess.DEVNULL)
    assert subprocess.run([str(py), "-c", "import gpubuf"], env=env, cwd=tmp_path,
                          stderr=subprocess.DEVNULL).returncode != 0


def test_editable_install(tmp_path, daemon):
    """pip install -e ./python (PEP 660): gpubuf imports from the tree, an
    edit to its Python code shows at the next import, uninstall removes it."""
    py, env, src = _venv(tmp_path)
    r = subprocess.run([str(py), "-m", "pip", "install", "--no-index", "-e", str(src / "python")],
                       env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert r.returncode == 0, r.stdout[-4000:]
    where = _run(py, env, tmp_path, "-c", "import gpubuf; print(gpubuf.__file__)").strip()
    assert where == str(src / "python" / "gpubuf" / "__init__.py")
    out = _run(py, env, tmp_path, "-c", SCRIPT.replace("sys.prefix", "sys.argv[2]"),
               daemon.socket, str(src / "python"))
    assert out.startswith("venv ok " + _cmake_version())
    with open(src / "python" / "gpubuf" / "__init__.py", "a") as f:
        f.write("\nEDITED = 42\n")
    assert _run(py, env, tmp_path, "-c", "import gpubuf; print(gpubuf.EDITED)").strip() == "42"
    subprocess.run([str(py), "-m", "pip", "uninstall", "-y", "gpubuf"], env=env, check=True,
                   stdout=subprocess.DEVNULL)
    assert subprocess.run([str(py), "-c", "import gpubuf"], env=env, cwd=tmp_path,
                          stderr=subprocess.DEVNULL).returncode != 0


def test_sdist_and_wheel_tags(tmp_path, daemon):
    """build_sdist gives gpubuf-VERSION.tar.gz (the project's sources, a
    pyproject.toml at its top); pip installs from it offline; the wheel pip
    built is tagged for this interpreter's ABI and platform."""
    py, env, src = _venv(tmp_path)
    dist = tmp_path / "dist"
    dist.mkdir()
    version = _cmake_version()
    name = _run(py, env, src / "python", "-c",
                "import sys; sys.path.insert(0, 'build_backend'); import gpubuf_build; "
                "print(gpubuf_build.build_sdist(sys.argv[1]))", str(dist)).strip()
    assert name == f"gpubuf-{version}.tar.gz"
    with tarfile.open(dist / name) as t:
        names = set(t.getnames())
        pyproject = t.extractfile(f"gpubuf-{version}/pyproject.toml").read().decode()
    base = f"gpubuf-{version}/"
    for f in ("PKG-INFO", "pyproject.toml", "CMakeLists.txt", "python/src/module.c",
              "python/build_backend/gpubuf_build.py", "client/client.c", "include/gpubuf/gpubuf.h"):
        assert base + f in names, f
    rel = [n[len(base):] for n in names]
    assert not [n for n in rel if n.startswith("build") or "build-editable" in n
                or n.endswith((".so", ".pyc"))], "build output in the sdist"
    assert 'backend-path = ["python/build_backend"]' in pyproject
    wheels = tmp_path / "wheels"
    r = subprocess.run([str(py), "-m", "pip", "wheel", "--no-index", "--no-deps", "-w", str(wheels),
                        str(dist / name)], env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-4000:]
    (wheel,) = os.listdir(wheels)
    impl = f"cp{sys.version_info[0]}{sys.version_info[1]}"
    plat = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    assert wheel == f"gpubuf-{version}-{impl}-{impl}{sys.abiflags}-{plat}.whl"
    subprocess.run([str(py), "-m", "pip", "install", "--no-index", str(wheels / wheel)], env=env,
                   check=True, stdout=subprocess.DEVNULL)
    out = _run(py, env, tmp_path, "-c", SCRIPT, daemon.socket)
    assert out.startswith("venv ok " + version)
