"""Fixtures for the gpubuf Python tests: a gpubufd of its own per test, on a
temporary socket. GPUBUFD (set by CTest) names the daemon binary."""
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

SRC = Path(os.environ.get("GPUBUF_SOURCE_DIR", Path(__file__).resolve().parents[2]))


def _gpubufd():
    path = os.environ.get("GPUBUFD") or shutil.which("gpubufd")
    if not path:
        for cand in (SRC / "build" / "daemon" / "gpubufd", SRC / "build-test" / "daemon" / "gpubufd"):
            if cand.exists():
                path = str(cand)
                break
    if not path:
        pytest.fail("set GPUBUFD to the gpubufd binary (CTest does)")
    return path


class Daemon:
    """gpubufd on `socket` with the given pools; stop() kills it."""

    def __init__(self, tmp, pools):
        self.socket = str(tmp / "gpubufd.sock")
        args = [_gpubufd(), "--socket", self.socket, "--log-level", "warning"]
        for p in pools:
            args += ["--pool", p]
        self.proc = subprocess.Popen(args)
        # Ready when a connection is accepted: the socket file appears at
        # bind(), a moment before listen().
        deadline = time.monotonic() + 60  # a CUDA pool initialises the driver first
        while not self._accepts():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"gpubufd did not start: {args}")
            time.sleep(0.02)

    def _accepts(self):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            try:
                s.connect(self.socket)
                return True
            except OSError:
                return False

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


HOST_POOLS = ["host=host,capacity=256M,slab=4M", "tiny=host,capacity=1M,slab=1M"]


@pytest.fixture
def daemon(tmp_path):
    d = Daemon(tmp_path, HOST_POOLS)
    yield d
    d.stop()


@pytest.fixture
def client(daemon):
    import gpubuf

    with gpubuf.Client(daemon.socket) as c:
        yield c


def buffer_refs(client, name):
    """The daemon's reference count of a buffer, by name."""
    for b in client.status()["buffers"]:
        if b["name"] == name:
            return b["refs"]
    raise KeyError(name)


def env_for(daemon):
    """Environment for a child process: the package on its path, our daemon."""
    env = dict(os.environ)
    env["GPUBUF_SOCKET"] = daemon.socket
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    return env


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a GPU, CuPy and a cuda-ipc pool")
    config.addinivalue_line("markers", "install: pip installs ./python into a virtual environment")
    config.addinivalue_line("markers", "torch_gpu: gpubuf.torch on CUDA tensors (PyTorch, a GPU)")
    config._gpubuf_counts = {"passed": 0, "failed": 0, "skipped": 0}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    counts = item.config._gpubuf_counts
    if rep.when == "call" or rep.skipped or rep.failed:
        key = "skipped" if rep.skipped else "failed" if rep.failed else "passed"
        counts[key] += 1


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    # A module that skipped itself at import (test_torch*.py without PyTorch).
    outcome = yield
    if outcome.get_result().skipped:
        collector.config._gpubuf_counts["skipped"] += 1


def pytest_sessionfinish(session, exitstatus):
    # Every test skipped (no GPU, no CuPy), or none left but modules that
    # skipped themselves (exit 5, no tests: -m torch_gpu without PyTorch):
    # exit 77, which CTest reports as a skip.
    c = session.config._gpubuf_counts
    if exitstatus in (0, pytest.ExitCode.NO_TESTS_COLLECTED) and c["skipped"] and \
            not c["passed"] and not c["failed"]:
        session.exitstatus = 77
