"""``poolsight.torch.fake_cuda``: a CUDA run on fake tensors, on this machine without a GPU.

The checks that matter most: the same code run for real on the CPU and on fake CUDA tensors
makes the same allocations (sizes, order, categories) wherever the kernels agree, and every
figure the fake run answers (``torch.cuda.*``, its snapshot, its trace) is the one the
allocator model replays from its requests."""

from __future__ import annotations

import json
import os
import pickle
import sys

import pytest
import torch
import torch.nn.functional as F
from conftest import report_json, run_cli

import poolsight
import poolsight.torch as pst

sys.path.insert(0, os.path.dirname(__file__))
import fake_models  # noqa: E402

MiB = 1 << 20


def _label(stacks: dict, sid: int, kind: str):
    while sid:
        s = stacks[sid]
        if s["kind"] == kind:
            return s["name"]
        sid = s["parent"]
    return None


def allocations(trace, tmp_path) -> list:
    """Each block a trace allocated, in order: [bytes, category, operator] (the category after
    any relabel)."""
    out_path = tmp_path / (os.path.basename(str(trace)) + ".jsonl")
    run_cli("export", trace, "--format", "json", "-o", out_path)
    stacks, out, live = {}, [], {}
    for line in open(out_path):
        e = json.loads(line)
        if e["type"] == "stack":
            stacks[e["id"]] = e
        elif e["type"] == "malloc_post":
            live[e["ptr"]] = len(out)
            out.append(
                [
                    e["bytes"],
                    _label(stacks, e["stack"], "label"),
                    _label(stacks, e["stack"], "function"),
                ]
            )
        elif e["type"] == "relabel" and e["ptr"] in live:
            out[live[e["ptr"]]][1] = _label(stacks, e["stack"], "label")
        elif e["type"] == "free_post":
            live.pop(e["ptr"], None)
    return out


def _rounded(n: int) -> int:
    """A CPU tensor's bytes as the CUDA caching allocator rounds a request (512 bytes)."""
    return max(512, -(-n // 512) * 512)


def record_both(name: str, tmp_path):
    """The model trained on the CPU for real and on fake CUDA tensors, each recorded."""
    cpu, fake = tmp_path / f"{name}-cpu.pstrace", tmp_path / f"{name}-cuda.pstrace"
    # oneDNN's fused CPU kernels (an LSTM's) make tensors PyTorch's own CPU kernels do not.
    # The native backend: no Python dispatch mode, under which the autograd engine would sum
    # gradients out of place where a plain run (and a GPU run) sums them in place.
    with torch.backends.mkldnn.flags(enabled=False):
        with poolsight.record(cpu), pst.track(backend="native"):
            m, opt, batch, kind = fake_models.make(name, "cpu")
            with pst.hook(m, links=False):
                seen_cpu = fake_models.train(m, opt, batch, kind, "cpu")
    with poolsight.record(fake), pst.fake_cuda("H100-80GB") as run:
        m, opt, batch, kind = fake_models.make(name, "cuda")
        with pst.hook(m, links=False):
            seen_fake = fake_models.train(m, opt, batch, kind, "cuda")
    return cpu, fake, run, seen_cpu, seen_fake


@pytest.mark.parametrize("name", fake_models.MODELS)
def test_the_same_code_on_the_cpu_and_on_fake_cuda_makes_the_same_allocations(name, tmp_path):
    if name in ("gpt2", "bert"):
        pytest.importorskip("transformers")
    cpu, fake, run, seen_cpu, seen_fake = record_both(name, tmp_path)
    # Differences where the devices differ, each taken out of the comparison:
    # - the cuBLAS workspaces only a CUDA run has (checked in their own test);
    # - the step counters of torch's Adam and AdamW, which stay on the CPU beside CUDA
    #   parameters (not capturable): 4-byte CPU tensors the CPU run counts and a GPU never holds.
    want = [
        [_rounded(b), c, op]
        for b, c, op in allocations(cpu, tmp_path)
        if not (c == "optimizer_state" and b <= 8)
    ]
    got = [a for a in allocations(fake, tmp_path) if a[1] != "workspace"]
    assert len(got) > 20
    assert got == want
    assert seen_fake == seen_cpu
    categories = {c for _, c, _ in got}
    assert {"parameter", "gradient", "optimizer_state", "activation"} <= categories, categories
    # What the fake run says of itself is the trace's figure.
    peak = report_json("info", fake)["pool"]["peak_used_bytes"]
    assert peak == run.peak_allocated_bytes


def test_dropout_keeps_a_one_byte_mask_on_cuda_and_a_float_one_on_the_cpu(tmp_path):
    def go(device):
        with torch.device(device):
            x = torch.randn(1024, 256, requires_grad=True)
            y = F.dropout(x, 0.1, training=True)
        y.sum().backward()

    cpu, fake = tmp_path / "cpu.pstrace", tmp_path / "cuda.pstrace"
    with (
        poolsight.record(cpu),
        pst.track(backend="python"),
        pst.hook(torch.nn.Module(), links=False),
    ):
        go("cpu")
    with poolsight.record(fake), pst.fake_cuda(), pst.hook(torch.nn.Module(), links=False):
        go("cuda")
    on_cpu = {(b, op) for b, _, op in allocations(cpu, tmp_path)}
    on_gpu = {(b, op) for b, _, op in allocations(fake, tmp_path)}
    # CUDA's fused kernel: the output and a bool mask, one byte an element; the CPU's
    # composite: a float mask the size of the input.
    assert (1024 * 256, "aten::native_dropout") in on_gpu
    assert (1024 * 256 * 4, "aten::empty_like") in on_cpu


def test_an_lstm_runs_pytorchs_own_cells_on_fake_cuda():
    with pst.fake_cuda() as run:
        m, opt, batch, kind = fake_models.make("lstm", "cuda")
        fake_models.train(m, opt, batch, kind, "cuda", steps=1)
        assert m.rnn.weight_ih_l0.grad is None  # zeroed after the step
    assert run.peak_allocated_bytes > 0


# -- torch.cuda, answered ----------------------------------------------------------------------


def test_torch_cuda_answers_for_the_gpu_and_from_the_allocator_model():
    with pst.fake_cuda("A100-40GB") as run:
        assert torch.cuda.is_available() and torch.cuda.device_count() == 1
        props = torch.cuda.get_device_properties(0)
        assert props.name == "NVIDIA A100-SXM4-40GB" and (props.major, props.minor) == (8, 0)
        assert props.total_memory == 40441 * MiB  # CUDA's totalGlobalMem, as the table says
        assert torch.cuda.get_device_capability() == (8, 0) and torch.cuda.is_bf16_supported()
        assert torch.cuda.memory_allocated() == 0
        a = torch.empty(1000, device="cuda")  # 4000 bytes: one 4096-byte block
        assert torch.cuda.memory_allocated() == 4096
        assert torch.cuda.memory_reserved() == 2 * MiB  # a small segment
        b = torch.empty(5 * MiB, dtype=torch.uint8, device="cuda")
        assert torch.cuda.memory_reserved() == 2 * MiB + 20 * MiB
        free, total = torch.cuda.mem_get_info()
        assert total == 40441 * MiB and free == run.gpu.capacity - 22 * MiB
        del b
        assert (
            torch.cuda.memory_allocated() == 4096
            and torch.cuda.max_memory_allocated() == 4096 + 5 * MiB
        )
        torch.cuda.reset_peak_memory_stats()
        assert torch.cuda.max_memory_allocated() == 4096
        torch.cuda.empty_cache()
        assert torch.cuda.memory_reserved() == 2 * MiB
        assert torch.cuda.memory_stats()["allocation.all.current"] == 1
        torch.cuda.synchronize()
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            c = torch.empty(10, device="cuda")
            assert torch.cuda.current_stream() == s
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        end.record()
        assert end.query() and start.elapsed_time(end) == 0.0
        del a, c
    assert not pst.is_fake()
    # Everything is put back.
    assert torch.cuda.memory_allocated is torch.cuda.memory.memory_allocated


def test_a_snapshot_of_the_fake_run_reads_in_pytorchs_viewer_and_in_poolsight(tmp_path):
    path = tmp_path / "fake.pickle"
    with pst.fake_cuda("L4"):
        torch.cuda.memory._record_memory_history(max_entries=100000)
        m, opt, batch, kind = fake_models.make("lm", "cuda")
        fake_models.train(m, opt, batch, kind, "cuda", steps=1)
        peak = torch.cuda.max_memory_allocated()
        reserved = torch.cuda.max_memory_reserved()
        torch.cuda.memory._dump_snapshot(str(path))
        torch.cuda.memory._record_memory_history(enabled=None)
    snapshot = pickle.loads(path.read_bytes())
    from torch.cuda import _memory_viz

    # PyTorch's own readers of snapshots: the segment summary, the trace as text, the pages of
    # its viewer, the flamegraph's lines (drawn without fetching flamegraph.pl).
    assert "segment" in _memory_viz.segsum(snapshot)
    assert "alloc" in _memory_viz.trace(snapshot)
    assert "<html" in _memory_viz.trace_plot(snapshot).lower()
    assert "<html" in _memory_viz.segment_plot(snapshot).lower()
    lines = _memory_viz.memory(snapshot, format_flamegraph=lambda text: text)
    assert "fake_models.py" in lines
    check = json.loads(run_cli("whatif", path, "--check", "--format", "json").stdout)["checks"][0]
    assert check["segments_recorded"] == check["segments_simulated"] == check["segments_matching"]
    assert check["blocks_checked"] == check["block_offsets_matching"] > 100
    info = report_json("info", path)
    assert info["pool"]["peak_used_bytes"] <= peak
    replayed = json.loads(run_cli("whatif", path, "--format", "json").stdout)["runs"][0]
    assert replayed["reserved_peak_bytes"] == reserved


# -- what runs ---------------------------------------------------------------------------------


def test_models_built_on_cuda_or_moved_there_train_with_autocast():
    with pst.fake_cuda():
        model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.LayerNorm(64))
        p = model[0].weight
        opt = torch.optim.AdamW(model.parameters())  # made before .cuda(): must keep working
        model.cuda()
        assert model[0].weight is p and p.device.type == "cuda"
        assert isinstance(p, torch.nn.Parameter)
        with torch.device("cuda"):
            other = torch.nn.Linear(64, 64)
        torch.nn.init.trunc_normal_(other.weight, std=0.02)
        torch.utils.swap_tensors(
            other.weight, torch.nn.Parameter(torch.empty(64, 64, device="cuda"))
        )
        x = torch.randn(8, 64, device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = model[0](x)
            assert y.dtype == torch.bfloat16
            loss = model[1](y).float().pow(2).mean()
        loss.backward()
        opt.step()
        assert set(opt.state[p]) == {"step", "exp_avg", "exp_avg_sq"}
        scaler = torch.amp.GradScaler("cuda")
        with torch.autocast("cuda", dtype=torch.float16):
            loss = model(x).float().pow(2).mean()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()


def test_backward_hooks_retain_graph_and_autograd_grad_run_and_free_what_backward_frees():
    with pst.fake_cuda():
        w = torch.randn(1024, 1024, device="cuda", requires_grad=True)
        x = torch.randn(1024, 1024, device="cuda")
        calls = []
        h = torch.tanh(x @ w)
        h.register_hook(lambda g: calls.append("tensor"))
        loss = h.sum()
        loss.backward(retain_graph=True)
        loss.backward()  # the graph was kept once
        assert calls == ["tensor", "tensor"]
        (g,) = torch.autograd.grad(torch.tanh(x @ w).sum(), [w])
        assert g.shape == w.shape
        del h, loss
        # The saved activations went with the graph: x, w, w.grad and g are left (4 MiB each),
        # with the cuBLAS workspaces of the forward thread and the autograd engine's (32 MiB
        # each on an H100).
        assert torch.cuda.memory_allocated() == 4 * 4 * MiB + 2 * 32 * MiB


def test_cublas_keeps_a_workspace_per_thread_and_stream_sized_for_the_gpu(monkeypatch):
    def workspaces(gpu):
        with pst.fake_cuda(gpu) as run:
            a = torch.randn(64, 64, device="cuda", requires_grad=True)
            torch.nn.functional.linear(
                a, torch.randn(64, 64, device="cuda"), torch.zeros(64, device="cuda")
            ).sum().backward()
            return {
                k[2]: v.numel() for k, v in run.router.workspaces.items() if k[0] != "autograd"
            }, sum(1 for k in run.router.workspaces if k[0] == "autograd")

    fwd, bwd = workspaces("H100-80GB")
    assert fwd == {"cublas": 32 * MiB, "cublaslt": 1 * MiB} and bwd == 1
    fwd, _ = workspaces("A100-40GB")
    assert fwd["cublas"] == 8 * MiB + 128 * 1024
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:2:16:8")
    monkeypatch.setenv("TORCH_CUBLASLT_UNIFIED_WORKSPACE", "1")
    fwd, _ = workspaces("H100-80GB")
    assert fwd == {"cublas": 4096 * 1024 * 2 + 16 * 1024 * 8}


@pytest.mark.parametrize(
    ("gpu", "dtype", "mask", "kernel"),
    [
        # sm_90 prefers cuDNN's kernel from cuDNN 9.15 on (what torch 2.15 bundles); flash
        # before it (torch 2.10's cuDNN 9.10).
        (
            "H100-80GB",
            torch.bfloat16,
            False,
            "cudnn" if (torch.backends.cudnn.version() or 0) > 91500 else "flash",
        ),
        ("A100-40GB", torch.bfloat16, False, "flash"),
        ("A100-40GB", torch.float32, False, "efficient"),
        ("A100-40GB", torch.bfloat16, True, "efficient"),
        ("T4", torch.float16, False, "efficient"),
    ],
)
def test_attention_runs_the_kernel_the_gpu_would_pick(gpu, dtype, mask, kernel):
    with pst.fake_cuda(gpu) as run:
        q = torch.randn(2, 4, 128, 64, device="cuda", dtype=dtype, requires_grad=True)
        m = torch.ones(128, 128, dtype=torch.bool, device="cuda").tril() if mask else None
        out = F.scaled_dot_product_attention(q, q, q, attn_mask=m)
        out.sum().backward()
        assert run.attention[kernel] == 1, run.attention
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
            F.scaled_dot_product_attention(q, q, q)
        assert run.attention["math"] == 1


# -- what cannot be faked, and out of memory ---------------------------------------------------


def test_a_value_asked_of_a_fake_tensor_names_the_line_unless_items_are_zero():
    with pst.fake_cuda():
        loss = torch.randn(4, device="cuda").sum()
        with pytest.raises(pst.FakeCudaError, match=r"test_fake_cuda\.py:\d+ .*asks for the value"):
            loss.item()
    with pst.fake_cuda(items="zero"):
        assert torch.randn(4, device="cuda").sum().item() == 0.0
        assert not bool(torch.ones(3, device="cuda").any())


def test_an_operator_without_a_fake_kernel_or_with_a_data_dependent_shape_is_named():
    lib = torch.library.Library("poolsight_test", "FRAGMENT")
    lib.define("noisy(Tensor x) -> Tensor")
    lib.impl("noisy", lambda x: x + 1, "CPU")
    with pst.fake_cuda():
        x = torch.randn(4, device="cuda")
        with pytest.raises(
            pst.FakeCudaError, match=r"poolsight_test\.noisy.*no fake .*test_fake_cuda\.py:\d+"
        ):
            torch.ops.poolsight_test.noisy(x)
        with pytest.raises(pst.FakeCudaError, match=r"aten\.nonzero.*depends on the values"):
            x.nonzero()
    assert torch.ops.poolsight_test.noisy(torch.zeros(1)).item() == 1.0


def test_a_request_past_the_gpu_raises_as_on_the_gpu_or_is_noted():
    with pst.fake_cuda(capacity="64MiB") as run:
        keep = torch.empty(40 * MiB, dtype=torch.uint8, device="cuda")
        with pytest.raises(torch.OutOfMemoryError, match="predicted by poolsight's fake_cuda"):
            torch.empty(40 * MiB, dtype=torch.uint8, device="cuda")
        del keep
    assert run.fits
    with pst.fake_cuda(capacity="64MiB", oom="continue") as run:
        a = torch.empty(40 * MiB, dtype=torch.uint8, device="cuda")
        b = torch.empty(40 * MiB, dtype=torch.uint8, device="cuda")  # the line
        del a, b
    assert not run.fits
    assert run.first_failure["requested_bytes"] == 40 * MiB
    assert "test_fake_cuda.py" in run.first_failure["line"]


def test_wrong_arguments_and_wrong_order_are_refused(trace):
    with pytest.raises(ValueError, match="(?s)unknown GPU .X9.*H100-80GB"):
        pst.fake_cuda("X9").__enter__()
    with pytest.raises(ValueError, match="not a size"):
        pst.fake_cuda(capacity="lots").__enter__()
    with pytest.raises(ValueError, match="oom must be"):
        pst.fake_cuda(oom="maybe").__enter__()
    with pst.fake_cuda():
        with pytest.raises(pst.FakeCudaError, match="already active"):
            pst.fake_cuda().__enter__()
    with poolsight.record(trace), pst.track():
        with pytest.raises(pst.FakeCudaError, match="must begin before"):
            pst.fake_cuda().__enter__()
    assert not pst.is_fake()


# -- recorded ----------------------------------------------------------------------------------


def test_a_recorded_fake_run_is_a_prediction_that_every_command_reads(tmp_path):
    trace = tmp_path / "p.pstrace"
    with poolsight.record(trace), pst.fake_cuda("A100-80GB") as run:
        m, opt, batch, kind = fake_models.make("lm", "cuda")
        with pst.track(m, opt):  # joins the tracking fake_cuda began
            fake_models.train(m, opt, batch, kind, "cuda", steps=1)
        reserved = torch.cuda.max_memory_reserved()
    info = run_cli("info", trace).stdout
    assert info.startswith("prediction: a CUDA run on A100-80GB (NVIDIA A100-SXM4-80GB)"), info
    assert "cuda:0 (GPU memory, predicted for A100-80GB" in info
    assert run_cli("report", trace).stdout.startswith("prediction: ")
    cats = {c["category"]: c for c in report_json("categories", trace)["categories"]}
    params = sum(p.numel() * 4 for p in m.parameters())
    assert cats["parameter"]["at_end_bytes"] >= params
    assert cats["optimizer_state"]["at_end_bytes"] >= 2 * params  # the hand-written Adam's
    replay = json.loads(run_cli("whatif", trace, "--format", "json").stdout)
    assert replay["capacity_bytes"] == run.gpu.capacity
    assert replay["runs"][0]["reserved_peak_bytes"] == reserved
    for command in ("lines", "functions", "timers", "oom"):
        run_cli(command, trace)
    run_cli("flamegraph", trace, "-o", tmp_path / "f.svg")
    run_cli("html", trace, "-o", tmp_path / "p.html")
    assert run_cli("diff", trace, trace).returncode == 0


def test_largest_batch_finds_a_size_that_fits_whose_next_does_not():
    def step(n):
        model = torch.nn.Linear(1024, 4096, device="cuda")
        model(torch.randn(n, 1024, device="cuda")).sum().backward()

    found = pst.largest_batch(step, capacity="200MiB", low=1, high=65536, quiet=True)
    n = found.largest
    assert n is not None and 1 < n < 65536
    tried = {t.n: t.fits for t in found.tried}
    assert tried[n] and found.monotonic
    for size, fits in ((n, True), (n + 1, False)):
        with pst.fake_cuda(capacity="200MiB", oom="continue") as run:
            step(size)
        assert run.fits is fits
    assert f"largest that fits in 200.00 MiB: {n}" in found.table()


def test_a_module_built_on_the_cpu_inside_the_run_is_fake_unless_asked_real():
    from torch._subclasses.fake_tensor import FakeTensor

    with pst.fake_cuda("A100-40GB") as run:
        # 64 Mi parameters (256 MiB of host memory if built for real), initialised as
        # recent torch does (trunc_normal_ loops on its values).
        model = torch.nn.Linear(8192, 8192, bias=False)
        torch.nn.init.trunc_normal_(model.weight, std=0.02)
        assert isinstance(model.weight, FakeTensor) and model.weight.device.type == "cpu"
        assert torch.cuda.memory_allocated() == 0
        model.cuda()
        assert model.weight.device.type == "cuda"
        assert torch.cuda.memory_allocated() == 8192 * 8192 * 4
        # Tensors made outside a module's construction stay real: data, CPU-side work.
        assert not isinstance(torch.ones(3), FakeTensor)
    assert run.peak_allocated_bytes == 8192 * 8192 * 4
    with pst.fake_cuda("A100-40GB", cpu_modules="real"):
        small = torch.nn.Linear(4, 4)
        assert not isinstance(small.weight, FakeTensor)
        assert float(small(torch.ones(1, 4)).sum()) == float(small(torch.ones(1, 4)).sum())
    with pytest.raises(ValueError, match="cpu_modules must be 'fake' or 'real'"):
        with pst.fake_cuda(cpu_modules="maybe"):
            pass
