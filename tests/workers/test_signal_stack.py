"""Issue 36's root cause and its fix: OpenVINO's CPU plugin leaves a thread an unmapped alternate signal stack, and
the next signal handled by Python kills the process with SIGSEGV; farm's signals and OpenVINO backend prevent it.

Each case runs in a fresh process: the crash it shows would otherwise end this test process."""
from __future__ import annotations

import importlib.util
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from tests.workers.engines.conftest import build_mlp
from workers import signal_stack

ROOT = Path(__file__).resolve().parents[2]

#: two OpenVINO CPU plugins, the first one freed first (``fifo``), or one freed on another thread (``thread``), as
#: garbage collection and a server's model reloads do; then this thread receives a signal handled in Python
SCENARIO = textwrap.dedent("""
    import gc, os, signal, sys, threading, time
    from pathlib import Path
    order, how, model = sys.argv[1], sys.argv[2], Path(sys.argv[3])

    def plugin():
        if how == "raw":  # OpenVINO used directly, as a library would
            import openvino as ov
            core = ov.Core()
            return core.compile_model(core.read_model(str(model)), "CPU")
        from workers.engines.backends import make_backend  # farm's backend
        backend = make_backend("openvino")
        backend.load(model, "cpu", 1)
        return backend

    if order == "fifo":
        first, second = plugin(), plugin()
        del first; gc.collect()
        del second; gc.collect()
    else:
        box = [plugin()]
        t = threading.Thread(target=box.clear)
        t.start(); t.join(); gc.collect()

    if how == "watch":  # farm's job watch interrupting a job, as it does in a worker
        from workers.cancel import JobInterrupt, JobWatch
        with JobWatch(lambda job: "running", poll_s=0.01) as watch:
            try:
                with watch.job("j", timeout_s=0.05):
                    time.sleep(30)
            except JobInterrupt as exc:
                print("interrupted", exc.reason)
    else:  # a handler installed by plain signal.signal (SA_ONSTACK), as asyncio's or a library's
        got = []
        signal.signal(signal.SIGUSR1, lambda *a: got.append(1))
        os.kill(os.getpid(), signal.SIGUSR1)
        time.sleep(0.05)
        print("handled", len(got))
    print("alive")
""")


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if importlib.util.find_spec("openvino") is None:  # not imported here: its import starts a thread of its own
        pytest.skip("openvino is not installed (pip install '.[openvino]')")
    return build_mlp(tmp_path_factory.mktemp("sigstack") / "mlp.onnx")


def _run(order: str, how: str, model: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", SCENARIO, order, how, str(model)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize("order", ["fifo", "thread"])
def test_openvino_used_directly_leaves_an_unmapped_signal_stack_that_kills_the_process(order: str,
                                                                                       model: Path) -> None:
    """The mechanism (no farm code in the process): the kernel cannot write the signal's frame on the unmapped
    stack and kills the process with SIGSEGV, with no Python traceback."""
    if not signal_stack.SUPPORTED:
        pytest.skip("Linux x86_64/aarch64 only")
    proc = _run(order, "raw", model)
    if proc.returncode == 0:
        pytest.skip("this OpenVINO gives a thread its signal stack back: the hazard is gone upstream")
    assert proc.returncode == -signal.SIGSEGV, (proc.returncode, proc.stderr[-2000:])
    assert "alive" not in proc.stdout


@pytest.mark.parametrize("order", ["fifo", "thread"])
@pytest.mark.parametrize("how", ["watch", "plain"])
def test_farm_lives_through_openvino_plugins_freed_out_of_order(order: str, how: str, model: Path) -> None:
    """farm's OpenVINO backend gives the thread its own stack back, and farm's signals do not use that stack: the
    job watch's interrupt lands, and even a handler installed with plain ``signal.signal`` runs."""
    proc = _run(order, how, model)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    assert proc.stdout.split()[-1] == "alive"
    assert ("interrupted timeout" if how == "watch" else "handled 1") in proc.stdout


def test_install_delivers_on_the_thread_stack_and_restore_gives_the_handler_back() -> None:
    if not signal_stack.SUPPORTED:
        pytest.skip("Linux x86_64/aarch64 only")

    def mine(signum: int, frame: object) -> None:
        return None

    before = signal.getsignal(signal.SIGUSR1)
    previous = signal_stack.install(signal.SIGUSR1, mine)
    try:
        assert previous == before
        assert signal.getsignal(signal.SIGUSR1) is mine
        assert signal_stack.onstack(signal.SIGUSR1) is False
    finally:
        signal_stack.restore(signal.SIGUSR1, previous)
    assert signal.getsignal(signal.SIGUSR1) == before


def test_keep_alternate_stack_gives_each_thread_a_stack_of_farms_own() -> None:
    if not signal_stack.SUPPORTED:
        pytest.skip("Linux x86_64/aarch64 only")
    seen: list[tuple[int, int] | None] = []

    def in_a_thread() -> None:  # a thread of its own: this test process's main thread keeps its stack
        assert signal_stack.keep_alternate_stack()
        seen.append(signal_stack.current_alternate_stack())
        assert signal_stack.keep_alternate_stack()  # again: the same stack, nothing allocated
        seen.append(signal_stack.current_alternate_stack())

    t = threading.Thread(target=in_a_thread)
    t.start()
    t.join()
    assert seen[0] is not None and seen[0] == seen[1]
    assert seen[0][1] >= signal_stack.STACK_BYTES
