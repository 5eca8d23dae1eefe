"""PyTorch's own memory files read by poolsight, checked against PyTorch's own functions.

Snapshots of real models come from ``_memory_viz._profile_to_snapshot`` on CPU profiles (the
genuine snapshot dicts PyTorch's tools make), pickled by Python's ``pickle`` with protocols 2
to 5, and poolsight's figures are compared with what ``_memory_viz``'s ``memory``,
``segments``, ``segsum``, ``trace`` and ``compare`` print for the same file (docs/
pytorch-files.md says what each comparison is, and what cannot be compared); hand-made
snapshots cover what a CPU run cannot make (segments and streams, expandable segments, a
``free_requested`` long before its ``free_completed``, ring overflow, OOM entries, several
devices, older layouts). Bad and hostile pickles must be one error line, exit 2."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
from memviz_oracle import (
    compared,
    live_by_segment_and_stack,
    live_by_stack,
    segsum_totals,
    trace_entries,
    viewer_peak,
)

torch = pytest.importorskip("torch")

from poolsight import _native  # noqa: E402


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "poolsight", *args], capture_output=True, text=True
    )


def info(path: Path, *extra: str) -> dict:
    r = cli("info", "--format", "json", *extra, str(path))
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def exported(path: Path, tmp: Path) -> tuple:
    """poolsight's JSON Lines export of a file: its stacks by id, and its other records in
    the order written. Its stacks are the frames PyTorch's own functions show
    (``--frames viewer``; the default, ``user``, reads them as the user's model)."""
    out = tmp / "events.jsonl"
    r = cli("--frames", "viewer", "export", "--format", "json", "-o", str(out), str(path))
    assert r.returncode == 0, r.stderr
    stacks, events = {}, []
    for line in out.read_text().splitlines():
        e = json.loads(line)
        if e["type"] == "stack":
            stacks[e["id"]] = e
        else:
            events.append(e)
    return stacks, events


def live_blocks(path: Path, tmp: Path) -> list:
    """poolsight's blocks live at the end: (address, bytes, frames), frames as ``_memory_viz``
    prints them (file base name), category labels left out."""
    stacks, events = exported(path, tmp)
    live = {}
    for e in events:
        if e["type"] == "malloc_post":
            live[(e["device"], e["ptr"])] = (e["bytes"], e["stack"])
        elif e["type"] == "free_post":
            live.pop((e["device"], e["ptr"]), None)

    def frames(sid: int) -> tuple:
        out = []
        while sid:
            s = stacks[sid]
            if s["kind"] == "foreign":
                out.append(f"{s['file'].split('/')[-1]}:{s['line']}:{s['name']}")
            sid = s["parent"]
        return tuple(reversed(out))

    return [(ptr, size, frames(sid)) for (_, ptr), (size, sid) in live.items()]


def live_at_end_by_stack(path: Path, tmp: Path) -> dict:
    by = defaultdict(int)
    for _, size, frames in live_blocks(path, tmp):
        by[frames] += size
    return dict(by)


def by_segment(blocks: list, snap: dict) -> dict:
    """{(segment address, frames): bytes} of blocks, each in the snapshot's segment that holds
    its address."""
    by = defaultdict(int)
    for ptr, size, frames in blocks:
        seg = next(
            s["address"]
            for s in snap["segments"]
            if s["address"] <= ptr < s["address"] + s["total_size"]
        )
        by[(seg, frames)] += size
    return dict(by)


def entries_written(path: Path, tmp: Path) -> list:
    """poolsight's allocations, free requests and frees, in order, as (action, size as
    ``_memory_viz`` prints sizes)."""
    from torch.cuda._memory_viz import Bytes

    kinds = {
        "malloc_post": "alloc",
        "free_requested": "free_requested",
        "free_post": "free_completed",
    }
    _, events = exported(path, tmp)
    return [(kinds[e["type"]], repr(Bytes(e["bytes"]))) for e in events if e["type"] in kinds]


def train_mlp() -> tuple:
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    opt = torch.optim.AdamW(model.parameters())
    x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
    for _ in range(3):
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    return model, opt


def train_cnn_transformer() -> tuple:
    conv = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(4)
    )
    layer = torch.nn.TransformerEncoderLayer(d_model=32, nhead=4, dim_feedforward=64)
    head = torch.nn.Linear(32, 5)
    params = [*conv.parameters(), *layer.parameters(), *head.parameters()]
    opt = torch.optim.SGD(params, lr=0.01, momentum=0.9)
    x = torch.randn(4, 3, 16, 16)
    for _ in range(2):
        f = conv(x).flatten(2).permute(2, 0, 1)  # (16, 4, 8)
        f = torch.nn.functional.pad(f, (0, 24))
        loss = head(layer(f)).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
    return conv, layer, head, opt


def snapshot_of(train) -> dict:
    """PyTorch's snapshot of a CPU profile of `train`. The model and its optimizer outlive the
    profile, so that their blocks are live at the end, in `segments`."""
    from torch.cuda._memory_viz import _profile_to_snapshot
    from torch.profiler import ProfilerActivity, profile

    with profile(
        activities=[ProfilerActivity.CPU],
        profile_memory=True,
        with_stack=True,
        record_shapes=True,
    ) as prof:
        kept = train()
    snap = _profile_to_snapshot(prof)
    del kept
    # `_profile_to_snapshot` leaves out a segment's `allocated_size` (its active blocks'
    # bytes), which `_memory_viz.trace` reads; poolsight does not.
    for seg in snap["segments"]:
        seg["allocated_size"] = sum(
            b["size"] for b in seg["blocks"] if b["state"] == "active_allocated"
        )
    return snap


@pytest.fixture(scope="module")
def snapshots() -> dict:
    return {"mlp": snapshot_of(train_mlp), "cnn": snapshot_of(train_cnn_transformer)}


@pytest.fixture(params=["mlp", "cnn"])
def profiled(request, snapshots) -> dict:
    return snapshots[request.param]


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_profile_snapshots_agree_with_pytorch(profiled, protocol, tmp_path):
    snap = profiled
    assert live_by_stack(snap), "blocks live at the end"
    path = tmp_path / "snapshot.pickle"
    path.write_bytes(pickle.dumps(snap, protocol=protocol))
    got = info(path)
    assert got["imported_from"]["kind"] == "pytorch-snapshot"
    assert got["imported_from"]["entries"] == sum(len(d) for d in snap["device_traces"])
    # The peak: the maximum of the viewer's active-memory timeline.
    assert got["pool"]["peak_used_bytes"] == viewer_peak(snap, 0)
    # What is live at the end: _memory_viz.memory's blocks, stack by stack.
    theirs = live_by_stack(snap)
    assert got["pool"]["used_at_end_bytes"] == sum(theirs.values())
    assert live_at_end_by_stack(path, tmp_path) == theirs


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_segsum_segments_and_trace_agree_with_pytorch(profiled, protocol, tmp_path):
    from torch.cuda._memory_viz import Bytes

    snap = profiled
    path = tmp_path / "snapshot.pickle"
    path.write_bytes(pickle.dumps(snap, protocol=protocol))
    got = info(path)
    pool = got["pool"]
    # segsum's totals: reserved is every segment's bytes, which poolsight holds from the
    # device at the end; allocated the active blocks' requested bytes, which are live at the
    # end; free the difference (poolsight has no split of it into rounding and gaps).
    totals = segsum_totals(snap)
    assert totals["total_reserved"] == repr(Bytes(pool["acquired_at_end_bytes"]))
    assert totals["total_allocated"] == repr(Bytes(pool["used_at_end_bytes"]))
    free = pool["acquired_at_end_bytes"] - pool["used_at_end_bytes"]
    assert totals["total_free"].split(" (")[0] == repr(Bytes(free))
    # segments: the bytes live at the end by segment and stack, byte for byte.
    blocks = live_blocks(path, tmp_path)
    assert by_segment(blocks, snap) == live_by_segment_and_stack(snap)
    # trace: the entries it counts, and each allocation, free request and completed free it
    # lists, in order and with its size, are poolsight's; what poolsight has before them are
    # the blocks allocated before the trace (live from the start).
    [(entries, listed)] = trace_entries(snap).values()
    assert entries == got["imported_from"]["entries"]
    ours = entries_written(path, tmp_path)
    assert ours[len(ours) - len(listed) :] == listed
    assert {action for action, _ in ours[: len(ours) - len(listed)]} <= {"alloc"}


@pytest.mark.parametrize("protocol", [2, 5])
def test_compare_agrees_with_pytorch(snapshots, protocol, tmp_path):
    # The two models' snapshots: each segment is in one only (compare keys a segment by
    # address and size), so compare lists all their active blocks, before's and after's.
    before, after = snapshots["mlp"], snapshots["cnn"]
    ours = {}
    for side, snap, other in (("only_before", before, after), ("only_after", after, before)):
        path = tmp_path / f"{side}.pickle"
        path.write_bytes(pickle.dumps(snap, protocol=protocol))
        (tmp_path / side).mkdir()
        theirs = {(s["address"], s["total_size"]) for s in other["segments"]}
        for (seg, frames), size in by_segment(live_blocks(path, tmp_path / side), snap).items():
            total = next(s["total_size"] for s in snap["segments"] if s["address"] == seg)
            if (seg, total) not in theirs:
                ours[(side, seg, frames)] = size
    assert ours
    assert ours == compared(before, after)


def test_converted_once_reads_the_same(profiled, tmp_path):
    snap = profiled
    path = tmp_path / "snapshot_3.pickle"
    pickle.dump(snap, path.open("wb"))
    out = tmp_path / "run.pstrace"
    r = cli("import", str(path), "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert "rank 3" in r.stdout
    direct, converted = info(path), info(out)
    assert converted["rank"] == 3
    assert direct["pool"] == converted["pool"]
    for cmd in ("lines", "report"):
        a, b = cli(cmd, str(path)), cli(cmd, str(out))
        assert a.returncode == b.returncode == 0
        assert a.stdout == b.stdout
    assert cli("import", str(path), "-o", str(out)).returncode == 2, "an existing output"
    assert cli("import", str(path), "-o", str(out), "--force").returncode == 0


def profile_of(train):
    from torch.profiler import ProfilerActivity, profile

    with profile(
        activities=[ProfilerActivity.CPU],
        profile_memory=True,
        with_stack=True,
        record_shapes=True,
    ) as prof:
        for step in range(3):
            with torch.profiler.record_function(f"ProfilerStep#{step}"):
                train()
    return prof


@pytest.mark.parametrize("train", [train_mlp, train_cnn_transformer], ids=["mlp", "cnn"])
def test_profile_json_and_from_profile(train, tmp_path):
    from poolsight.torch import from_profile

    js = tmp_path / "trace.json"
    profile_of(train).export_chrome_trace(str(js))
    got = info(js)
    assert got["imported_from"]["kind"] == "torch-profiler"
    # PyTorch's own totals: "Total Allocated" after each memory event counts what was
    # allocated before the profile too; poolsight counts from the blocks the trace shows
    # (those it frees without allocating them were live from the start).
    events = json.loads(js.read_text())["traceEvents"]
    mem = sorted((e for e in events if e.get("name") == "[memory]"), key=lambda e: e["ts"])
    args = [e["args"] for e in mem]
    assert got["events"]["malloc_post"] == sum(1 for a in args if a["Bytes"] > 0)
    before = args[0]["Total Allocated"] - args[0]["Bytes"]
    seen, initial = set(), 0
    for a in args:
        if a["Bytes"] > 0:
            seen.add(a["Addr"])
        elif a["Addr"] in seen:
            seen.discard(a["Addr"])
        else:
            initial -= a["Bytes"]
    top = max(a["Total Allocated"] for a in args)
    assert got["pool"]["peak_used_bytes"] == max(top - before + initial, initial)
    # ATen operators are the functions table's rows, with their memory.
    fn = json.loads(cli("functions", "--format", "json", str(js)).stdout)["functions"]
    names = {r["name"] for r in fn}
    assert "aten::empty" in names or "aten::addmm" in names or "aten::conv2d" in names
    assert sum(r["self_used_bytes"] for r in fn) > 0
    timers = json.loads(cli("timers", "--format", "json", str(js)).stdout)
    assert timers["functions"] and timers["links"]
    ep = json.loads(cli("epochs", "--format", "json", str(js)).stdout)["epochs"]
    assert [e["epoch"] for e in ep] == [0, 1, 2]
    # from_profile (of a profile not exported yet) carries PyTorch's categories as labels.
    out = tmp_path / "prof.pstrace"
    summary = from_profile(profile_of(train), out)
    assert summary["kind"] == "torch-profiler"
    lines = cli("lines", str(out)).stdout
    assert "parameter" in lines or "activation" in lines or "gradient" in lines
    # The exported trace has no categories: they are inferred, and the gradients and the
    # optimizer's state live at the peak are the profiler's own (the model is made inside
    # the profile and dropped after each step, so the profiler's parameters are our inputs
    # and temporaries: "never freed" is what tells a parameter from its stack).
    inferred = json.loads(cli("categories", "--format", "json", str(js)).stdout)
    recorded = json.loads(cli("categories", "--format", "json", str(out)).stdout)
    assert inferred["inferred"] is True and not recorded["inferred"]

    def at_peak(j):
        return {c["category"]: c["at_peak_bytes"] for c in j["categories"]}

    for c in ("gradient", "optimizer_state"):
        assert at_peak(inferred)[c] == at_peak(recorded)[c] > 0, (c, at_peak(inferred))


def ent(action, t=0, stream=0, **kw):
    return {"action": action, "stream": stream, "time_us": t, **kw}


def snapshot(traces, segments=(), **extra):
    d = {"segments": list(segments), "device_traces": traces}
    d.update(extra)
    return d


def frames(*names):
    return [{"filename": "train.py", "line": i + 1, "name": n} for i, n in enumerate(names)]


def write(tmp_path: Path, snap, name="s.pickle", protocol=2) -> Path:
    p = tmp_path / name
    p.write_bytes(pickle.dumps(snap, protocol=protocol))
    return p


def test_segments_streams_and_awaited_frees(tmp_path):
    f = frames("step", "forward")
    traces = [
        [
            ent("segment_alloc", addr=1 << 20, size=2 << 20, t=10),
            ent("alloc", addr=1 << 20, size=512, t=11, frames=f),
            ent("alloc", addr=(1 << 20) + 512, size=1024, t=12, stream=77, frames=f),
            ent("free_requested", addr=1 << 20, size=512, t=13),
            ent("alloc", addr=(1 << 20) + 4096, size=2048, t=14, frames=f),
            ent("free_completed", addr=1 << 20, size=512, t=30),
            ent("free_requested", addr=(1 << 20) + 512, size=1024, t=31, stream=77),
            ent("free_completed", addr=(1 << 20) + 512, size=1024, t=31, stream=77),
            ent("segment_map", addr=8 << 20, size=2 << 20, t=32),
            ent("segment_unmap", addr=8 << 20, size=2 << 20, t=33),
            ent("snapshot", addr=0, size=0, t=34),
        ]
    ]
    segs = [
        {
            "device": 0,
            "address": 1 << 20,
            "total_size": 2 << 20,
            "stream": 0,
            "segment_type": "large",
            "is_expandable": False,
            "blocks": [
                {"size": 4096, "requested_size": 4096, "state": "inactive"},
                {"size": 2048, "requested_size": 2000, "state": "active_allocated", "frames": f},
                {"size": (2 << 20) - 6144, "requested_size": 0, "state": "inactive"},
            ],
        }
    ]
    snap = snapshot(traces, segs, allocator_settings={"expandable_segments": True})
    got = info(write(tmp_path, snap))
    assert got["pool"]["peak_used_bytes"] == viewer_peak(snap) == 512 + 1024 + 2048
    assert got["pool"]["used_at_end_bytes"] == 2048
    assert got["pool"]["peak_acquired_bytes"] == 4 << 20
    assert got["pool"]["acquired_at_end_bytes"] == 2 << 20
    assert got["events"]["free_requested"] == 2
    assert got["events"]["snapshot"] == 1
    assert not got["imported_from"]["overflowed"]
    assert sorted({0, 1}) == sorted(
        {json.loads(x)["stream"] for x in cli_jsonl(tmp_path, snap) if '"malloc_post"' in x}
    )


def cli_jsonl(tmp_path, snap):
    p = write(tmp_path, snap, "j.pickle")
    out = tmp_path / "j.jsonl"
    assert cli("export", "--format", "json", "-o", str(out), str(p)).returncode == 0
    return out.read_text().splitlines()


def test_ring_overflow_blocks_live_from_the_start(tmp_path):
    f = frames("step")
    traces = [
        [
            # freed, never allocated in the ring: live from the start
            ent("free_completed", addr=4096, size=8192, t=1, frames=f),
            ent("alloc", addr=(1 << 20) + 65536, size=1024, t=2, frames=f),
        ]
    ]
    segs = [
        {
            "device": 0,
            "address": 1 << 20,
            "total_size": 1 << 20,
            "stream": 0,
            "blocks": [
                # active, allocated before the ring: live from the start at its requested size
                {"size": 4096, "requested_size": 3000, "state": "active_allocated", "frames": f},
                {"size": 61440, "requested_size": 0, "state": "inactive"},
                {"size": 1024, "requested_size": 1024, "state": "active_allocated", "frames": f},
                {"size": (1 << 20) - 66560, "requested_size": 0, "state": "inactive"},
            ],
        }
    ]
    snap = snapshot(traces, segs)
    got = info(write(tmp_path, snap))
    assert got["imported_from"]["overflowed"]
    assert got["pool"]["peak_used_bytes"] == viewer_peak(snap) == 8192 + 3000
    assert got["pool"]["used_at_end_bytes"] == 3000 + 1024


def test_oom_devices_and_annotations(tmp_path):
    f = frames("step")
    traces = [
        [
            ent("alloc", addr=512, size=1 << 30, t=5, frames=f),
            ent("oom", size=2 << 30, t=6, device_free=1 << 20, frames=f),
            ent("annotate", addr=512, size=0, t=7, user_metadata="weights"),
        ],
        [
            ent("alloc", addr=512, size=4096, t=5, frames=f),
        ],
    ]
    ann = [
        {"name": "ProfilerStep#1", "stage": "START", "device": 0, "time_us": 4},
        {"name": "ProfilerStep#1", "stage": "END", "device": 0, "time_us": 8},
    ]
    snap = snapshot(traces, external_annotations=ann)
    p = write(tmp_path, snap)
    got = info(p)
    assert got["pool"]["out_of_memory"] == 1
    assert got["events"]["device_free"] == 1 and got["events"]["annotation"] == 1
    assert len(got["devices"]) == 2
    # two devices: the pool's figures are their sum; each device's as the viewer's
    assert got["pool"]["peak_used_bytes"] == viewer_peak(snap, 0) + viewer_peak(snap, 1)
    ep = json.loads(cli("epochs", "--format", "json", str(p)).stdout)["epochs"]
    assert [e["epoch"] for e in ep] == [1]


def test_older_layouts(tmp_path):
    # no device_traces, blocks with history (before `frames` moved onto blocks), no time_us
    segs = [
        {
            "address": 1 << 20,
            "total_size": 8192,
            "stream": 0,
            "allocated_size": 4096,
            "blocks": [
                {
                    "size": 4096,
                    "state": "active_allocated",
                    "history": [{"addr": 0, "real_size": 4000, "frames": frames("old")}],
                },
                {"size": 4096, "state": "inactive"},
            ],
        }
    ]
    got = info(write(tmp_path, {"segments": segs}))
    assert got["pool"]["used_at_end_bytes"] == 4000
    got = info(write(tmp_path, segs, "list.pickle"))  # the segments list alone
    assert got["pool"]["used_at_end_bytes"] == 4000
    no_time = snapshot([[{"action": "alloc", "addr": 1, "size": 10, "stream": 0}]])
    got = info(write(tmp_path, no_time, "t.pickle", protocol=0))
    assert got["pool"]["peak_used_bytes"] == 10
    assert any("time_us" in u for u in got["imported_from"]["unmapped"])


class Hostile:
    def __reduce__(self):
        return (os.system, ("echo pwned > hacked.txt",))


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"not a pickle at all",
        pickle.dumps({"segments": [1]}, protocol=2)[:-5],
        pickle.dumps([1, 2, 3]),
        pickle.dumps({"a": 1}),
        pickle.dumps(Hostile(), protocol=2),
        pickle.dumps(Hostile(), protocol=5),
        b"\x80\x02X\xff\xff\xff\x7fabc",
        b"\x80\x02]q\x00(" + b"K\x01" * 3 + b"e" * 2 + b".",
    ],
    ids=["empty", "text", "truncated", "list", "other-dict", "hostile2", "hostile5", "huge", "bad"],
)
def test_bad_pickles_are_one_line_exit_2(content, tmp_path):
    p = tmp_path / "bad.pickle"
    p.write_bytes(content)
    r = subprocess.run(
        [sys.executable, "-m", "poolsight", "report", str(p)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert r.returncode == 2, r
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "panicked" not in r.stderr
    assert not (tmp_path / "hacked.txt").exists()
    if b"posix" in content:
        assert "posix.system" in r.stderr and "refused" in r.stderr
    with pytest.raises(_native.PoolsightError):
        _native.import_file(str(p), str(tmp_path / "out.pstrace"))


def test_record_history_needs_cuda(tmp_path):
    from poolsight.torch import record_history

    if torch.cuda.is_available():
        pytest.skip("with CUDA, record_history is tested on a GPU (test_record_history_on_gpu)")
    with pytest.raises(RuntimeError, match="needs CUDA"):
        with record_history(tmp_path / "t.pstrace"):
            pass


def test_record_history_on_gpu(tmp_path):
    from poolsight.torch import record_history

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    out = tmp_path / "gpu.pstrace"
    with record_history(out, max_entries=10_000):
        x = torch.randn(1024, 1024, device="cuda")
        y = (x @ x).relu()
        del x, y
    got = info(out)
    assert got["events"]["malloc_post"] >= 3
    assert got["pool"]["peak_used_bytes"] >= 3 * 4 * 1024 * 1024
