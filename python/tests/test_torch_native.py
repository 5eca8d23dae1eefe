"""The native backend of ``poolsight.torch.track()``: built on first use and cached, the same
figures as the Python backend, a clear fallback where it cannot be had, and a profiler at the
same time (docs/python.md, "Backends")."""

import os
import shutil
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from conftest import report_json, run_cli
from torch import nn

import poolsight
import poolsight.torch as pst
from poolsight import _native_observer as observer


@pytest.fixture(scope="module")
def native():
    """The native observer of this PyTorch (built into the user's cache the first time)."""
    try:
        return observer.load()
    except observer.Unavailable as e:
        print(f"skipped: no native observer here ({e})", file=sys.stderr)
        pytest.skip(f"no native observer here: {e}")


@pytest.fixture
def fresh(monkeypatch):
    """Each test's fallback message said anew, and no library loaded before it."""
    monkeypatch.setattr(pst, "_said", set())
    monkeypatch.setattr(observer, "_loaded", {})


class Tagger(nn.Module):
    """An LSTM tagger: embedding, LSTM, a linear layer per position."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(100, 32)
        self.lstm = nn.LSTM(32, 64, batch_first=True)
        self.out = nn.Linear(64, 10)

    def forward(self, x):
        h, _ = self.lstm(self.embed(x))
        # On the (batch * positions, features) matrix: on a 3-D input, `linear` adds the bias
        # out of place under a dispatch mode (composite compliance) and in place without one,
        # so the Python backend would record an allocation the program makes only under it.
        return self.out(h.reshape(-1, h.shape[-1]))


def train_tagger(trace, backend, steps=3):
    torch.manual_seed(0)
    model = Tagger()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y = torch.randint(0, 100, (8, 12)), torch.randint(0, 10, (8, 12))
    with poolsight.record(trace):
        with pst.track(model, opt, backend=backend), pst.hook(model, backend=backend):
            for _ in range(steps):
                opt.zero_grad()
                loss = F.cross_entropy(model(x), y.flatten())
                loss.backward()
                opt.step()
    return model, opt


def untimed(value):
    """``value`` without its instants (``*_ns``), which differ from run to run."""
    if isinstance(value, dict):
        return {k: untimed(v) for k, v in value.items() if not k.endswith("_ns")}
    if isinstance(value, list):
        return [untimed(v) for v in value]
    return value


def figures(trace):
    """What the reports say that a backend could change: categories (peak and end), each
    module's figures, the functions and the folded stacks with their bytes."""
    cats = untimed(report_json("categories", trace))
    functions = untimed(report_json("functions", trace))
    folded = run_cli("export", "--format", "folded", trace, "-o", "-").stdout
    return cats, functions, sorted(folded.splitlines())


def test_both_backends_give_the_same_figures_on_an_lstm_with_momentum(native, tmp_path):
    runs = {}
    for backend in ("native", "python"):
        path = tmp_path / f"{backend}.pstrace"
        train_tagger(path, backend)
        runs[backend] = figures(path)
    (cats, functions, folded), theirs = runs["native"], runs["python"]
    assert cats == theirs[0]
    assert folded == theirs[2]

    # Every function's bytes and calls, but aten::detach's calls: a dispatch mode makes
    # PyTorch detach what autograd saves (as the profiler shows, the program does not).
    def rows(f):
        return {
            r["name"]: {
                k: v
                for k, v in r.items()
                if not (r["name"] == "aten::detach" and k == "occurrence")
            }
            for r in f["functions"]
        }

    assert rows(functions) == rows(theirs[1])
    # The momentum buffers are optimizer state at the end, made inside SGD.step.
    at_end = {c["category"]: c["at_end_bytes"] for c in cats["categories"]}
    params = sum(4 * n for n in (100 * 32, 4 * 64 * 32, 4 * 64 * 64, 2 * 4 * 64, 64 * 10, 10))
    assert at_end["parameter"] == params and at_end["optimizer_state"] == params


def made_before_and_freed_inside(trace, backend):
    """Data made before tracking began, seen inside it (through a view, and given to
    ``track_tensor``) and freed there, then more allocated than it held: the CPU allocator
    reports no free of a block allocated before, so only a backend that watches it sees it go.
    """
    data = torch.randn(1000, 1000)  # 4 MB, before tracking
    kept = torch.randn(500, 1000)  # 2 MB, before tracking
    with poolsight.record(trace), pst.track(backend=backend) as tracker:
        tracker.track_tensor(kept, "input")
        view = data.view(-1)  # the view's output is data's storage: recorded as input
        total = view.sum().item()
        del data, view, kept
        after = torch.zeros(2000, 1000)  # 8 MB, once both are gone
        del after
    return total


@pytest.mark.parametrize("backend", ["native", "python"])
def test_data_made_before_tracking_and_freed_inside_it_is_freed_in_the_trace(
    native, tmp_path, backend
):
    trace = tmp_path / f"{backend}.pstrace"
    made_before_and_freed_inside(trace, backend)
    cats = {c["category"]: c for c in report_json("categories", trace)["categories"]}
    # The peak is the 8 MB made last, alone: the 4 MB and the 2 MB were freed before it.
    assert report_json("categories", trace)["peak_used_bytes"] == 8_000_000
    assert cats["input"]["at_end_bytes"] == 0
    assert cats["input"]["max_bytes"] == 8_000_000


@pytest.mark.parametrize("memory", ["torch", "numpy"])
def test_many_storages_made_before_tracking_are_freed_in_the_trace(native, tmp_path, memory):
    # A thousand tensors made before tracking, each seen through a view. PyTorch's own memory
    # takes the observer's deleter, which tells each free at once. A storage over a NumPy array
    # cannot (its deleter's context is the array, not the data): the observer watches those
    # through weak references, looking at a few per operator (so that an operator does not pay
    # for all of them), and records each free when it finds it expired, a few operators later.
    import numpy as np

    trace = tmp_path / f"{memory}.pstrace"
    if memory == "torch":
        data = [torch.randn(1024) for _ in range(1000)]  # 4,096,000 bytes
    else:
        data = [torch.from_numpy(np.ones(1024, dtype=np.float32)) for _ in range(1000)]
    with poolsight.record(trace), pst.track(backend="native"):
        views = [d.view(-1) for d in data]
        del views, data
        a = torch.zeros(64)  # 256 bytes
        for _ in range(100):
            a = a + 1
        big = torch.zeros(2_000_000)  # 8,000,000 bytes, once the thousand are gone
        del big
    cats = {c["category"]: c for c in report_json("categories", trace)["categories"]}
    assert cats["input"]["max_bytes"] >= 4_096_000
    assert cats["input"]["at_end_bytes"] == 256  # `a` alone
    assert report_json("categories", trace)["peak_used_bytes"] == 8_000_000 + 256


def test_data_made_before_tracking_is_freed_without_pytorchs_profiler_warning(native, tmp_path):
    # PyTorch's CPU allocator warns at the first free of a block it has no size for while
    # memory is reported, naming a profiler: native track() asks it for no memory reports (its
    # deleters tell the frees), so data made before tracking and freed inside it does not
    # bring the warning. A fresh process, as the warning comes once.
    program = (
        "import poolsight, poolsight.torch as pst, torch\n"
        "before = torch.zeros(1000)\n"
        "{inside}\n"
        "    del before\n"
        "    after = torch.zeros(2000)\n"
    )
    tracked = program.format(
        inside=f"with poolsight.record({str(tmp_path / 'run.pstrace')!r}), "
        "pst.track(backend='native'):"
    )
    profiled = program.format(inside="with torch.profiler.profile(profile_memory=True):")
    env = dict(os.environ)
    env.pop("TORCH_CPP_LOG_LEVEL", None)

    def stderr(code):
        proc = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300
        )
        assert proc.returncode == 0, proc.stderr
        return proc.stderr

    # The profiler's run shows the warning this test looks for ...
    assert "unknown size" in stderr(profiled)
    # ... and track()'s does not.
    assert "unknown size" not in stderr(tracked)
    cats = {
        c["category"]: c for c in report_json("categories", tmp_path / "run.pstrace")["categories"]
    }
    assert cats["input"]["at_end_bytes"] == 8000


def mapped(path) -> bool:
    """Whether this process still maps the file at ``path`` (Linux's /proc)."""
    with open("/proc/self/maps") as maps:
        return any(line.rstrip().endswith(str(path)) for line in maps)


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="needs Linux's /proc")
@pytest.mark.parametrize("backend", ["native", "python"])
def test_a_model_that_outlives_its_recordings_keeps_none_of_them(native, tmp_path, backend):
    # A model kept across recordings (a notebook, a test session's fixture): its parameters,
    # recorded by each, kept each recording's file mapped (a terabyte of address space: a
    # few hundred recordings of one model and the next one failed) as long as they lived.
    import gc
    import weakref

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
    for i in range(3):
        trace = tmp_path / f"{backend}-{i}.pstrace"
        with poolsight.record(trace) as rec:
            with pst.track(model, opt, backend=backend):
                opt.zero_grad()
                F.cross_entropy(model(x), y).backward()
                opt.step()
        # The recording kept, finished: the tensors it saw carry nothing of it.
        assert weakref.getweakrefcount(model[0].weight.untyped_storage()) == 0
        storages = [p.grad.untyped_storage() for p in model.parameters()]
        assert all(weakref.getweakrefcount(s) == 0 for s in storages)
        del storages
        del rec
        gc.collect()
        assert not mapped(trace), f"recording {i} is still mapped after it was let go"
        assert report_json("categories", trace)["peak_used_bytes"] > 0


@pytest.mark.parametrize("backend", ["native", "python"])
def test_storages_freed_on_another_thread_are_freed_in_the_trace(native, tmp_path, backend):
    # A queue's consumer lets go of what the training thread made, on a thread that does not
    # track: the storage's deleter (the observer's, in front of the allocator's) tells the free
    # there and then, before the next operator of the training thread.
    import queue
    import threading

    trace = tmp_path / f"{backend}.pstrace"
    handed, taken = queue.Queue(), threading.Event()

    def consumer():
        x = handed.get()
        del x
        taken.set()

    other = threading.Thread(target=consumer)
    other.start()
    with poolsight.record(trace), pst.track(backend=backend):
        handed.put(torch.ones(1_000_000))  # 4,000,000 bytes, freed on the consumer's thread
        assert taken.wait(30)
        big = torch.zeros(2_000_000)  # 8,000,000 bytes, the first operator after the 4 MB went
        del big
    other.join()
    cats = {c["category"]: c for c in report_json("categories", trace)["categories"]}
    assert report_json("categories", trace)["peak_used_bytes"] == 8_000_000
    assert cats["input"]["at_end_bytes"] == 0


@pytest.mark.parametrize("backend", ["native", "python"])
def test_operators_of_a_thread_that_does_not_track_are_not_recorded(native, tmp_path, backend):
    import threading

    trace = tmp_path / f"{backend}.pstrace"
    started, done = threading.Event(), threading.Event()

    def elsewhere():
        started.wait()
        x = torch.zeros(3000, 1000)  # 12 MB on a thread that does not track
        (x + 1).sum()
        done.set()

    other = threading.Thread(target=elsewhere)
    other.start()
    with poolsight.record(trace), pst.track(backend=backend):
        mine = torch.ones(500, 1000)  # 2 MB here
        started.set()
        assert done.wait(30)
        del mine
    other.join()
    assert report_json("categories", trace)["peak_used_bytes"] == 2_000_000


def test_native_is_what_auto_picks_and_says_nothing(native, trace, capsys, fresh):
    model = nn.Linear(4, 4)
    with poolsight.record(trace), pst.track(model) as tracker:
        model(torch.randn(2, 4)).sum().backward()
        assert poolsight.active()._torch.backend == pst._AUTO
    assert tracker.recorded > 0
    assert "Python backend" not in capsys.readouterr().err


def test_a_library_is_built_once_and_loaded_from_the_cache(native, tmp_path, monkeypatch, fresh):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    path = observer.library_path()
    assert path.startswith(str(tmp_path / "poolsight")) and not os.path.exists(path)
    built = []
    real_build = observer.build

    def build(p):
        built.append(p)
        real_build(p)

    monkeypatch.setattr(observer, "build", build)
    lib = observer.load()
    assert built == [path] and os.path.exists(path)
    assert lib.poolsight_observer_version() == observer.TABLE_VERSION
    monkeypatch.setattr(observer, "_loaded", {})
    observer.load()
    assert built == [path], "the cached library was built again"


def test_another_pytorch_or_python_is_another_library(native, tmp_path, monkeypatch, fresh):
    """A changed PyTorch version (or Python ABI) names another file, which is built; the old
    one is left for the other installation."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    source = open(observer.SOURCE, "rb").read()
    key = observer.cache_key(torch.__version__, observer.python_abi(), source)
    assert key != observer.cache_key(torch.__version__ + ".post1", observer.python_abi(), source)
    assert key != observer.cache_key(torch.__version__, "cpython-399-x86_64-linux-gnu", source)
    assert key != observer.cache_key(torch.__version__, observer.python_abi(), source + b" ")
    assert key == observer.cache_key(torch.__version__, observer.python_abi(), source)
    # This PyTorch's library, already built: loaded as it is.
    os.makedirs(tmp_path / "poolsight")
    shutil.copy(native._name, observer.library_path())
    built = []
    monkeypatch.setattr(
        observer, "build", lambda p: (built.append(p), shutil.copy(native._name, p))
    )
    observer.load()
    assert built == []
    # The same installation with a new PyTorch version: built anew, under another name.
    monkeypatch.setattr(torch, "__version__", torch.__version__ + ".post1")
    monkeypatch.setattr(observer, "_loaded", {})
    observer.load()
    assert len(built) == 1 and ".post1" in os.path.basename(built[0])


def test_without_a_compiler_auto_falls_back_with_one_line(
    trace, tmp_path, monkeypatch, capsys, fresh
):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("CXX", "/nonexistent/c++")
    model = nn.Linear(4, 4)
    with poolsight.record(trace):
        for _ in range(2):
            with pst.track(model) as tracker:
                model(torch.randn(2, 4)).sum().backward()
            assert tracker.recorded > 0
    err = capsys.readouterr().err
    line = (
        "poolsight: track() observes with the Python backend: "
        "CXX=/nonexistent/c++ names no compiler"
    )
    assert err.count(line) == 1, err
    with poolsight.record(tmp_path / "b.pstrace"):
        with pytest.raises(poolsight.PoolsightError, match="cannot use the native backend: CXX="):
            with pst.track(model, backend="native"):
                pass


def test_without_a_compiler_on_path_a_fresh_process_falls_back(tmp_path):
    """No ``CXX`` and no compiler on ``PATH`` (a PATH of Python's folder alone)."""
    script = (
        "import poolsight, poolsight.torch as pst, torch\n"
        f"with poolsight.record({str(tmp_path / 'run.pstrace')!r}):\n"
        "    with pst.track() as t:\n"
        "        torch.ones(3) * 2\n"
        "print(t.recorded)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "CXX"}
    env["PATH"] = os.path.dirname(sys.executable)
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    assert int(proc.stdout) > 0
    assert proc.stderr.strip().splitlines() == [
        "poolsight: track() observes with the Python backend: no C++ compiler found "
        "(set CXX, or install g++ or clang++)"
    ], proc.stderr


def test_a_failed_build_falls_back_and_says_the_compilers_error(
    trace, tmp_path, monkeypatch, capsys, fresh
):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    bad = tmp_path / "bad.cpp"
    bad.write_text("#include <no_such_header_here.h>\n")
    monkeypatch.setattr(observer, "SOURCE", str(bad))
    with poolsight.record(trace), pst.track():
        torch.ones(3) * 2
    err = capsys.readouterr().err
    assert "observes with the Python backend: building it with" in err
    assert "no_such_header_here.h" in err
    assert not [p for p in os.listdir(tmp_path / "poolsight") if p.endswith(".so")]


def test_a_profiler_running_means_the_python_backend_and_both_record(native, trace, capsys, fresh):
    from torch.profiler import ProfilerActivity, profile

    model = nn.Linear(8, 8)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        with poolsight.record(trace), pst.track(model):
            assert poolsight.active()._torch.backend == "python"
            model(torch.randn(4, 8)).sum().backward()
    assert "the Python backend: a torch.profiler is running" in capsys.readouterr().err
    names = {e.key for e in prof.key_averages()}
    assert "aten::addmm" in names
    assert any(e.cpu_memory_usage for e in prof.key_averages())
    cats = {c["category"] for c in report_json("categories", trace)["categories"]}
    assert {"parameter", "activation"} <= cats


def test_a_profiler_started_inside_native_track_works_and_misses_no_free(native, trace, capsys):
    from torch.profiler import ProfilerActivity, profile

    model = nn.Linear(8, 8)
    with poolsight.record(trace), pst.track(model, backend="native"):
        model(torch.randn(4, 8)).sum().backward()
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            model(torch.randn(4, 8)).sum().backward()
            during = torch.ones(1_000_000)  # 4,000,000 bytes, made and freed under the profiler
            del during
            after = torch.ones(2_000_000)  # 8,000,000 bytes, the next operator
            del after
        model(torch.randn(4, 8)).sum().backward()
    # The profiler saw its operators and the allocator's memory reports ...
    assert "aten::addmm" in {e.key for e in prof.key_averages()}
    assert any(e.cpu_memory_usage for e in prof.key_averages())
    # ... and the trace every free, those under the profiler too: nothing made while tracking
    # is left but what the model keeps (its parameters and their gradients).
    assert capsys.readouterr().err == ""
    cats = {c["category"]: c for c in report_json("categories", trace)["categories"]}
    # The 4 MB was gone before the 8 MB came (told at once, not found later).
    assert 8_000_000 <= report_json("categories", trace)["peak_used_bytes"] < 8_100_000
    for name in ("input", "activation", "temporary"):
        assert cats.get(name, {"at_end_bytes": 0})["at_end_bytes"] == 0, name


def test_backend_names_are_checked(trace):
    with poolsight.record(trace):
        with pytest.raises(ValueError, match="backend must be one of 'auto', 'native', 'python'"):
            with pst.track(backend="c++"):
                pass
        with pytest.raises(ValueError, match="backend must be one of"):
            with pst.hook(nn.Linear(2, 2), backend=None):
                pass


def test_track_and_hook_asking_for_different_backends_is_refused(native, trace):
    model = nn.Linear(2, 2)
    with poolsight.record(trace), pst.track(model, backend="python"):
        with pytest.raises(poolsight.PoolsightError, match="python backend already observes"):
            with pst.hook(model, backend="native"):
                pass
        with pst.hook(model):  # auto joins what runs
            model(torch.randn(1, 2))
