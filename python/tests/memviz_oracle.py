"""PyTorch's own figures for a snapshot, for the tests to compare poolsight's with.

``viewer_peak`` follows ``process_alloc_data`` of PyTorch's viewer (``torch/utils/viz/
MemoryViz.js``, the Active Memory Timeline) line by line: the maximum of its ``max_at_time``,
the memory drawn at each step. The others read what ``torch.cuda._memory_viz``'s functions
print: ``memory`` and ``segments`` (folded flamegraph lines of the blocks in ``segments``, by
stack, and by segment and stack), ``compare`` (the same, of the segments only one of two
snapshots has), ``segsum`` (its closing totals) and ``trace`` (its listing of the entries)."""

import contextlib
import io
import re
from collections import defaultdict


def viewer_peak(snapshot, device=0):
    """The maximum of the viewer's active-memory timeline of one device."""
    traces = snapshot.get("device_traces", [])
    events = []
    # annotate_snapshot: a free_requested directly followed by its free_completed is one 'free'
    for e in traces[device] if device < len(traces) else []:
        if e["action"] == "free_completed" and events:
            prev = events[-1]
            if prev["action"] == "free_requested" and prev["addr"] == e["addr"]:
                events[-1] = dict(prev, action="free")
                continue
        events.append(e)
    elements, initially, actions, addr_to_alloc = [], [], [], {}
    for e in events:
        if e["action"] == "alloc":
            elements.append(e["size"])
            addr_to_alloc[e["addr"]] = len(elements) - 1
            actions.append(len(elements) - 1)
        elif e["action"] in ("free", "free_completed"):
            if e["addr"] in addr_to_alloc:
                actions.append(addr_to_alloc.pop(e["addr"]))
            else:
                elements.append(e["size"])
                initially.append(len(elements) - 1)
                actions.append(len(elements) - 1)
    for seg in snapshot.get("segments", []):
        if seg.get("device") != device:
            continue
        addr = seg["address"]
        for b in seg["blocks"]:
            if b["state"] == "active_allocated" and addr not in addr_to_alloc:
                elements.append(b.get("requested_size", b["size"]))
                initially.append(len(elements) - 1)
            addr += b["size"]
    if not actions and initially:
        actions.append(initially.pop())
    total = sum(elements[i] for i in initially)
    current = set(initially)
    drawn = [total] if initially else []
    for i in actions:
        if i in current:
            drawn.append(total)  # advance() records the step before the block goes
            current.discard(i)
            total -= elements[i]
        else:
            current.add(i)
            total += elements[i]
            drawn.append(total)
    return max(drawn, default=0)


def _folded(text):
    """The lines of a folded flamegraph: (its frames, separated by ``;``; its bytes)."""
    for line in text.splitlines():
        path, size = line.rsplit(" ", 1)
        yield path.split(";"), int(size)


# ``_profile_to_snapshot`` writes a profiler's Python call as the frame {filename: "none",
# line: 0, name: "path/file.py(18): function"}, which the viewer prints "none:0:path/file.py(18):
# function"; poolsight takes the file and line out of the name (and these tests print a file by
# its base name): "file.py:18:function".
_PROFILER_CALL = re.compile(r"^none:0:(.*)\((\d+)\): (.*)$")


def _frame(part):
    m = _PROFILER_CALL.match(part)
    if m is None:
        return part
    return f"{m.group(1).split('/')[-1]}:{m.group(2)}:{m.group(3)}"


def _frames(parts):
    return tuple(_frame(p) for p in parts if p != "<non-python>")


def live_by_stack(snapshot):
    """{(frame, ..., outermost first): bytes} of the blocks active at the end, as
    ``_memory_viz.memory`` prints them (the file's base name, ``file:line:name``)."""
    from torch.cuda import _memory_viz

    out = defaultdict(int)
    for parts, size in _folded(_memory_viz.memory(snapshot, format_flamegraph=lambda s: s)):
        if parts[1] != "active_allocated":
            continue
        out[_frames(parts[2:])] += size
    return dict(out)


def live_by_segment_and_stack(snapshot):
    """{(segment address, (frame, ...)): bytes} of the blocks active at the end, as
    ``_memory_viz.segments`` prints them. Its ``<gaps>`` lines (the rounding of a block, its
    size less its requested size) are left out."""
    from torch.cuda import _memory_viz

    out = defaultdict(int)
    for parts, size in _folded(_memory_viz.segments(snapshot, format_flamegraph=lambda s: s)):
        _stream, segment, state, *frames = parts
        if state != "active_allocated" or frames == ["<gaps>"]:
            continue
        out[(int(segment.removeprefix("seg_")), _frames(frames))] += size
    return dict(out)


def compared(before, after):
    """{(side, segment address, (frame, ...)): bytes} of the active blocks that
    ``_memory_viz.compare`` prints for the segments only one snapshot has (``only_before``,
    ``only_after``; a segment is its address and size)."""
    from torch.cuda import _memory_viz

    # It prints the two lists of segment addresses too.
    with contextlib.redirect_stdout(io.StringIO()):
        text = _memory_viz.compare(
            before["segments"], after["segments"], format_flamegraph=lambda s: s
        )
    out = defaultdict(int)
    for parts, size in _folded(text):
        side, _stream, segment, state, *frames = parts
        if state != "active_allocated" or frames == ["<gaps>"]:
            continue
        out[(side, int(segment.removeprefix("seg_")), _frames(frames))] += size
    return dict(out)


def segsum_totals(snapshot):
    """The totals ``_memory_viz.segsum`` closes with, as it prints them: ``segments``,
    ``total_reserved``, ``total_allocated``, ``total_free``."""
    from torch.cuda import _memory_viz

    keys = ("segments", "total_reserved", "total_allocated", "total_free")
    return {
        k: v
        for k, _, v in (line.partition(": ") for line in _memory_viz.segsum(snapshot).splitlines())
        if k in keys
    }


_TRACE_LINES = [
    ("alloc", re.compile(r"^\S+ = \S+\[\d+:(\S+)\]$")),
    ("free_requested", re.compile(r"^del \S+ # (\S+)$")),
    ("free_completed", re.compile(r"^# free completed for \S+ (\S+)$")),
]


def trace_entries(snapshot):
    """{device: (entries, lines)} of what ``_memory_viz.trace`` prints for each device that has
    entries: the number of entries it announces, and its lines for allocations, free requests
    and completed frees, in order, as (action, size as printed)."""
    from torch.cuda import _memory_viz

    devices, current = {}, None
    for line in _memory_viz.trace(snapshot).splitlines():
        if line.startswith("Device "):
            current = devices[int(line.split()[1])] = [None, []]
        elif current[0] is None and line.endswith(" entries"):
            current[0] = int(line.split()[0])
        else:
            for action, pattern in _TRACE_LINES:
                m = pattern.match(line)
                if m:
                    current[1].append((action, m.group(1)))
    return {d: tuple(v) for d, v in devices.items()}
