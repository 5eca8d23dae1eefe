//! The recorder as bindings call it (the Python package, the C ABI): scopes entered and exited
//! by token with a file and line given as values, foreign call stacks interned once, and
//! memory events of an allocator poolsight does not own.

use crate::support::common;

use common::{trace_path, Trace};
use poolsight::recorder::{
    ForeignFrame, MemKind, MemRecord, Phase, Recorder, RecorderConfig, ScopeError, ScopeKind,
};
use poolsight::schema::fb;

fn recorder(name: &str) -> Recorder {
    Recorder::create(trace_path(name), RecorderConfig::default()).expect("recorder")
}

#[test]
fn tokens_nest_and_record_what_guards_record() {
    let rec = recorder("foreign-tokens");
    let h = rec.handle();
    let link = h.enter(ScopeKind::Link, "MLP", Phase::None, "model.py", 12);
    assert_eq!(h.current_stack(), link.stack());
    let f = h.enter(
        ScopeKind::Function,
        "LinearFunction",
        Phase::Backward,
        "linear.py",
        40,
    );
    assert_eq!(h.current_stack(), f.stack());
    let guard = h.scope("rust side");
    assert_eq!(h.current_stack(), guard.stack(), "guards nest under tokens");
    drop(guard);
    h.exit(f).expect("exit function");
    assert_eq!(h.current_stack(), link.stack());
    // The same call site again: the cached stack.
    let again = h.enter(
        ScopeKind::Function,
        "LinearFunction",
        Phase::Backward,
        "linear.py",
        40,
    );
    assert_eq!(again.stack(), f.stack());
    h.exit(again).expect("exit again");
    h.exit(link).expect("exit link");
    assert_eq!(h.current_stack(), 0);
    let path = h.path();
    rec.finish().expect("finish");

    let t = Trace::read(&path);
    assert_eq!(t.names(f.stack()), ["MLP", "LinearFunction"]);
    let frame = t.frame(f.stack());
    assert_eq!(
        (frame.kind, frame.phase, frame.file.as_str(), frame.line),
        (
            fb::FrameKind::Function,
            fb::Phase::Backward,
            "linear.py",
            40
        )
    );
    let link_frame = t.frame(link.stack());
    assert_eq!(
        (link_frame.kind, link_frame.file.as_str(), link_frame.line),
        (fb::FrameKind::Link, "model.py", 12)
    );
    let closed: Vec<u32> = t.scopes.iter().map(|&(s, _)| s).collect();
    assert_eq!(closed.len(), 4, "{closed:?}");
    assert_eq!(closed.last(), Some(&link.stack()));
}

#[test]
fn a_scope_stack_kept_opens_the_scope_enter_under_opens() {
    let rec = recorder("foreign-scope-stack");
    let h = rec.handle();
    let link = h.enter(ScopeKind::Link, "Net", Phase::None, "model.py", 3);
    h.exit(link).expect("exit link");
    // Under a stack no longer open (a backward operator under the module that made it).
    let kept = h.scope_stack(
        link.stack(),
        ScopeKind::Function,
        "aten::mm",
        Phase::Backward,
        "",
        0,
    );
    assert_eq!(h.current_stack(), 0, "scope_stack opens nothing");
    let under = h.enter_under(
        link.stack(),
        ScopeKind::Function,
        "aten::mm",
        Phase::Backward,
        "",
        0,
    );
    assert_eq!(under.stack(), kept, "the same scope, the same stack");
    h.exit(under).expect("exit enter_under's");
    let op = h.enter_stack(kept);
    assert_eq!(h.current_stack(), kept);
    let inner = h.scope("inside");
    let inside = inner.stack();
    drop(inner);
    h.exit(op).expect("exit enter_stack's");
    assert_eq!(h.current_stack(), 0);
    assert_eq!(h.enter_stack(0).stack(), 0, "stack 0 opens nothing");
    let path = h.path();
    rec.finish().expect("finish");

    let t = Trace::read(&path);
    assert_eq!(t.names(kept), ["Net", "aten::mm"]);
    assert_eq!(t.parent(inside), kept, "what opens inside nests under it");
    let frame = t.frame(kept);
    assert_eq!(
        (frame.kind, frame.phase),
        (fb::FrameKind::Function, fb::Phase::Backward)
    );
    let mm_calls = t.scopes.iter().filter(|&&(s, _)| s == kept).count();
    assert_eq!(mm_calls, 2, "each opening is a call of it");
}

#[test]
fn out_of_order_exits_behave_as_guards_and_double_exits_are_refused() {
    let rec = recorder("foreign-out-of-order");
    let h = rec.handle();
    let outer = h.enter(ScopeKind::Scope, "outer", Phase::None, "a.py", 1);
    let inner = h.enter(ScopeKind::Scope, "inner", Phase::None, "a.py", 2);
    h.exit(outer).expect("outer closes first");
    assert_eq!(h.current_stack(), 0, "the inner scope closed with it");
    let later = h.enter(ScopeKind::Scope, "later", Phase::None, "a.py", 3);
    h.exit(inner)
        .expect("the orphaned inner scope still closes");
    assert_eq!(
        h.current_stack(),
        later.stack(),
        "a stale token must not pop a scope opened after it was closed"
    );
    assert_eq!(h.exit(inner), Err(ScopeError::NotOpen));
    assert_eq!(h.exit(outer), Err(ScopeError::NotOpen));
    assert_eq!(h.current_stack(), later.stack());
    h.exit(later).expect("exit later");
    let path = h.path();
    rec.finish().expect("finish");
    let t = Trace::read(&path);
    assert_eq!(t.scopes.len(), 3, "refused exits record nothing");
}

#[test]
fn tokens_of_other_threads_and_recorders_are_refused() {
    let rec1 = recorder("foreign-rec1");
    let rec2 = recorder("foreign-rec2");
    let (h1, h2) = (rec1.handle(), rec2.handle());
    let t1 = h1.enter(ScopeKind::Scope, "one", Phase::None, "a.py", 1);
    assert_eq!(h2.exit(t1), Err(ScopeError::OtherRecorder));
    let h1_thread = h1.clone();
    let refused = std::thread::spawn(move || {
        let own = h1_thread.enter(ScopeKind::Scope, "own", Phase::None, "b.py", 1);
        let refused = h1_thread.exit(t1);
        assert_eq!(h1_thread.current_stack(), own.stack(), "untouched");
        h1_thread.exit(own).expect("own token");
        refused
    })
    .join()
    .expect("thread");
    assert_eq!(refused, Err(ScopeError::OtherThread));
    assert_eq!(h1.current_stack(), t1.stack(), "still open on its thread");
    h1.exit(t1).expect("exit on its own thread");
    let path = h1.path();
    drop(rec2);
    rec1.finish().expect("finish");
    let t = Trace::read(&path);
    assert_eq!(t.scopes.len(), 2);
}

#[test]
fn foreign_stacks_are_interned_once_and_hang_under_the_open_scopes() {
    let rec = recorder("foreign-stacks");
    let h = rec.handle();
    let frames = [
        ForeignFrame {
            file: "train.py",
            line: 10,
            function: "<module>",
        },
        ForeignFrame {
            file: "train.py",
            line: 42,
            function: "step",
        },
    ];
    let top = h.foreign_stack(&frames, true);
    assert_ne!(top, 0);
    assert_eq!(h.foreign_stack(&frames, true), top, "cached");
    assert_eq!(h.foreign_stack(&frames, false), top, "no scope open");
    assert_eq!(h.foreign_stack(&[], false), 0);
    let scope = h.enter(ScopeKind::Link, "MLP", Phase::None, "model.py", 5);
    let under = h.foreign_stack(&frames, true);
    assert_ne!(under, top);
    assert_eq!(h.foreign_stack(&frames, false), top);
    assert_eq!(h.foreign_stack(&[], true), scope.stack());
    // A sibling line shares the prefix.
    let sibling = h.foreign_stack(
        &[
            frames[0],
            ForeignFrame {
                line: 43,
                ..frames[1]
            },
        ],
        false,
    );
    h.record_mem(MemRecord {
        ptr: 0x1000,
        bytes: 1000,
        stack: under,
        pmem: 1,
        ..MemRecord::new(MemKind::MallocPost, 0, 0)
    });
    h.record_mem(MemRecord {
        ptr: 0x1000,
        bytes: 1024,
        pmem: 1,
        ..MemRecord::new(MemKind::FreePost, 0, 0)
    });
    h.exit(scope).expect("exit");
    let path = h.path();
    rec.finish().expect("finish");

    let t = Trace::read(&path);
    assert_eq!(t.names(top), ["<module>", "step"]);
    assert_eq!(t.names(under), ["MLP", "<module>", "step"]);
    assert_eq!(t.parent(sibling), t.parent(top));
    let leaf = t.frame(top);
    assert_eq!(
        (leaf.kind, leaf.file.as_str(), leaf.line),
        (fb::FrameKind::Foreign, "train.py", 42)
    );
    let mallocs = t.mem_of(fb::MemKind::MallocPost);
    assert_eq!(mallocs.len(), 1);
    assert_eq!((mallocs[0].stack(), mallocs[0].bytes()), (under, 1000));
    assert_eq!(t.mem_of(fb::MemKind::FreePost).len(), 1);
}

#[test]
fn memory_records_saturate_devices_and_streams() {
    let r = MemRecord::new(MemKind::AllocPost, 300, 70_000);
    assert_eq!((r.device, r.stream), (u8::MAX, u16::MAX));
    assert_eq!((r.ptr, r.bytes, r.stack, r.pmem), (0, 0, 0, 0));
}
