"""PyTorch's own figures for a snapshot, for the tests to compare poolsight's with.

``viewer_peak`` follows ``process_alloc_data`` of PyTorch's viewer (``torch/utils/viz/
MemoryViz.js``, the Active Memory Timeline) line by line: the maximum of its ``max_at_time``,
the memory drawn at each step. ``live_by_stack`` reads ``torch.cuda._memory_viz.memory`` (the
flamegraph of the blocks in ``segments``) as folded lines."""

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


def live_by_stack(snapshot):
    """{(frame, ..., outermost first): bytes} of the blocks active at the end, as
    ``_memory_viz.memory`` prints them (the file's base name, ``file:line:name``)."""
    from torch.cuda import _memory_viz

    folded = _memory_viz.memory(snapshot, format_flamegraph=lambda lines: lines)
    out = defaultdict(int)
    for line in folded.splitlines():
        stack, size = line.rsplit(" ", 1)
        parts = stack.split(";")
        if parts[1] != "active_allocated":
            continue
        frames = tuple(p for p in parts[2:] if p != "<non-python>")
        out[frames] += int(size)
    return dict(out)
