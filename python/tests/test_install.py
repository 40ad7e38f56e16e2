"""pip install ./python into a fresh virtual environment, with no package index:
the in-tree build backend needs nothing from one."""
import os
import shutil
import subprocess
import sys
import sysconfig

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


def test_pip_install_into_a_venv(tmp_path, daemon):
    if subprocess.run([sys.executable, "-c", "import ensurepip"]).returncode != 0:
        if sys.executable.startswith("/usr/bin/"):  # Debian's: scripts/deps.sh installs it
            pytest.fail(f"{sys.executable} has no ensurepip (Debian: python3-venv)")
        pytest.skip(f"{sys.executable} has no ensurepip: cannot make a virtual environment")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    py = venv / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1", GPUBUF_JOBS="2")
    # pip copies nothing: it builds from the source tree; work on a copy so the
    # tree stays untouched whatever pip leaves behind.
    src = tmp_path / "src"
    def skip(folder, names):  # build trees and caches of the checkout
        top = os.path.samefile(folder, SRC)
        return [n for n in names if n in (".git", "__pycache__", ".gpudeps", ".whl")
                or (top and n.startswith("build"))]

    shutil.copytree(SRC, src, ignore=skip)
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
