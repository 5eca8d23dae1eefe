"""A process forked while recording — a ``DataLoader``'s workers, ``multiprocessing`` with the
fork start method, ``os.fork()`` — records nothing into its parent's trace, and never damages
it: the mapping is shared with the parent, but a child's copy of the recorder would hand out the
parent's regions again. (Before, half of a run's chunks were lost with two workers, and a child
that finished its copy cut the file short under its parent.)"""

import os
import sys

import pytest
from conftest import report_json

import poolsight

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="no os.fork on this system")


def whole(trace) -> dict:
    info = report_json("info", trace)
    assert info["warnings"] == [] and info["incomplete"] == [], info
    return info


def test_a_forked_child_records_nothing_into_its_parents_trace(trace):
    with poolsight.record(trace) as rec:
        for _ in range(10):
            with rec.function("parent_before"):
                pass
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                for _ in range(20_000):
                    with rec.function("child_scope"):
                        pass
                done = rec.finish(pack=True)
                if done["forked"] and done["file_bytes"] == 0 and "packed_path" not in done:
                    code = 0
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, "the child's finish() wrote or raised"
        for _ in range(10):
            with rec.function("parent_after"):
                pass
    assert rec.closed
    whole(trace)
    calls = {r["name"]: r["occurrence"] for r in report_json("timers", trace)["functions"]}
    assert calls == {"parent_before": 10, "parent_after": 10}, calls
    assert not os.path.exists(str(trace).replace(".pstrace", ".packed.pstrace"))


def test_dataloader_workers_leave_a_tracked_run_whole(trace, backend):
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader, Dataset

    import poolsight.torch as pst

    class Data(Dataset):
        def __len__(self):
            return 1024

        def __getitem__(self, i):
            # An operator the training never runs: the workers' own.
            x = torch.arange(64, dtype=torch.float32).cumsum(0) / 2080
            return x, i % 10

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    with poolsight.record(trace), pst.track(model, opt), pst.hook(model):
        for _ in range(2):
            loader = DataLoader(
                Data(), batch_size=64, num_workers=2, multiprocessing_context="fork"
            )
            for x, y in loader:
                opt.zero_grad()
                torch.nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
    whole(trace)
    names = {r["name"] for r in report_json("functions", trace)["functions"]}
    assert "aten::addmm" in names, sorted(names)
    assert not any("cumsum" in n or "arange" in n for n in names), sorted(names)
    print(f"{backend}: {len(names)} functions, none of the workers'", file=sys.stderr)


def test_a_forked_child_passes_operators_over(trace, backend):
    """In a worker, neither backend does its work per operator (it would all be dropped): the
    native observer is inert there, and the dispatch mode calls the operator straight away."""
    torch = pytest.importorskip("torch")
    import poolsight.torch as pst

    model = torch.nn.Linear(8, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(16)
    with poolsight.record(trace), pst.track(model, opt) as tracker:
        x = x * 2  # recorded here, in the parent
        seen = tracker.recorded
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                ys = [x + i for i in range(100)]
                code = 0 if tracker.recorded == seen and len(ys) == 100 else 3
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, "the child recorded its operators' outputs"
        y = x + 1  # and here again
        assert tracker.recorded == seen + 1, (tracker.recorded, seen)
    assert y.shape == (16,)
    whole(trace)
