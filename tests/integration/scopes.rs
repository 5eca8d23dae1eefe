//! Scopes as Chainer's hooks would open them: the stacks they intern, the events they write when
//! they close, and what happens when guards are dropped in an unusual order.

use crate::support::common;

use common::{trace_path, Trace};
use poolsight::recorder::{Phase, Recorder, RecorderConfig};
use poolsight::schema::fb;

fn recorder(name: &str) -> Recorder {
    Recorder::create(trace_path(name), RecorderConfig::default()).expect("recorder")
}

#[test]
fn nested_scopes_intern_child_stacks_under_their_parent() {
    let rec = recorder("scopes-nested");
    let h = rec.handle();
    let (l, f, s, link_line, fn_line, scope_line) = {
        assert_eq!(h.current_stack(), 0, "no scope open yet");
        let (link, link_line) = (h.link("Classifier"), line!());
        let (func, fn_line) = (h.function("LinearFunction", Phase::Backward), line!());
        let (user, scope_line) = (h.scope("step"), line!());
        assert_eq!(h.current_stack(), user.stack());
        let ids = (link.stack(), func.stack(), user.stack());
        (ids.0, ids.1, ids.2, link_line, fn_line, scope_line)
    };
    assert_eq!(h.current_stack(), 0, "every scope closed");
    let path = h.path();
    rec.finish().expect("finish");

    let t = Trace::read(&path);
    assert_eq!(t.parent(l), 0);
    assert_eq!(t.parent(f), l);
    assert_eq!(t.parent(s), f);
    assert_eq!(t.names(s), ["Classifier", "LinearFunction", "step"]);

    let link = t.frame(l);
    assert_eq!(
        (link.kind, link.phase),
        (fb::FrameKind::Link, fb::Phase::None)
    );
    assert_eq!((link.file.as_str(), link.line), (file!(), link_line));
    let func = t.frame(f);
    assert_eq!(
        (func.kind, func.phase, func.line),
        (fb::FrameKind::Function, fb::Phase::Backward, fn_line)
    );
    let user = t.frame(s);
    assert_eq!((user.kind, user.line), (fb::FrameKind::Scope, scope_line));

    // Closed innermost first, each with a duration that fits inside its parent's.
    let stacks: Vec<u32> = t.scopes.iter().map(|&(s, _)| s).collect();
    assert_eq!(stacks, [s, f, l]);
    let d: Vec<u64> = t.scopes.iter().map(|&(_, d)| d).collect();
    assert!(d[0] <= d[1] && d[1] <= d[2], "durations nest: {d:?}");
}

#[test]
fn a_repeated_scope_reuses_its_stack_and_interns_nothing_new() {
    let rec = recorder("scopes-repeat");
    let h = rec.handle();
    let mut ids = Vec::new();
    for _ in 0..1000 {
        let outer = h.link("MLP");
        let inner = h.function("ReLU", Phase::Forward);
        ids.push((outer.stack(), inner.stack()));
    }
    let path = h.path();
    rec.finish().expect("finish");

    assert!(
        ids.iter().all(|&p| p == ids[0]),
        "one stack pair for every iteration"
    );
    let t = Trace::read(&path);
    assert_eq!(t.stacks.len(), 2, "MLP and MLP>ReLU, interned once");
    assert_eq!(t.frames.len(), 2);
    assert_eq!(t.scopes.len(), 2000);
}

#[test]
fn name_site_phase_and_parent_each_make_a_distinct_stack() {
    let rec = recorder("scopes-distinct");
    let h = rec.handle();
    let site = |name: &str| h.scope(name).stack();
    let a = site("a");
    let b = site("b");
    let a_again = site("a");
    let fwd = h.function("f", Phase::Forward).stack();
    let bwd = h.function("f", Phase::Backward).stack();
    let other_line = h.scope("a").stack();
    let nested = {
        let _p = h.link("parent");
        site("a")
    };
    assert_eq!(a, a_again, "same name at the same site and parent");
    assert_ne!(a, b, "names differ");
    assert_ne!(fwd, bwd, "phases differ");
    assert_ne!(a, other_line, "sites differ");
    assert_ne!(a, nested, "parents differ");
    let path = h.path();
    rec.finish().expect("finish");
    let t = Trace::read(&path);
    assert_eq!(t.names(nested), ["parent", "a"]);
    assert_eq!(t.frame(a).line, t.frame(nested).line);
}

#[test]
fn dropping_an_outer_guard_early_closes_the_inner_ones_on_the_stack() {
    let rec = recorder("scopes-out-of-order");
    let h = rec.handle();
    let outer = h.scope("outer");
    let inner = h.scope("inner");
    let inner_stack = inner.stack();
    drop(outer);
    assert_eq!(
        h.current_stack(),
        0,
        "the outer drop popped the inner scope too"
    );
    let later = h.scope("later");
    let later_inner = h.scope("later_inner");
    assert_eq!(h.current_stack(), later_inner.stack());
    // `inner` sat at the depth `later_inner` now holds.
    drop(inner);
    assert_eq!(
        h.current_stack(),
        later_inner.stack(),
        "a stale guard must not pop a scope opened after it was closed"
    );
    drop(later_inner);
    assert_eq!(h.current_stack(), later.stack());
    let later_stack = later.stack();
    drop(later);
    assert_eq!(h.current_stack(), 0);
    let path = h.path();
    rec.finish().expect("finish");

    let t = Trace::read(&path);
    assert_eq!(
        t.parent(later_stack),
        0,
        "opened at the top after the early drop"
    );
    let closed: Vec<u32> = t.scopes.iter().map(|&(s, _)| s).collect();
    assert!(
        closed.contains(&inner_stack),
        "the stale guard still records itself"
    );
    assert_eq!(closed.len(), 4);
}

#[test]
fn stacks_are_per_thread_and_per_recorder() {
    let rec1 = recorder("scopes-rec1");
    let rec2 = recorder("scopes-rec2");
    let (h1, h2) = (rec1.handle(), rec2.handle());
    let s1 = h1.scope("one");
    assert_eq!(h1.current_stack(), s1.stack());
    assert_eq!(h2.current_stack(), 0, "another recorder has its own stack");
    let s2 = h2.scope("two");
    assert_eq!(h2.current_stack(), s2.stack());
    assert_eq!(h1.current_stack(), s1.stack());
    let h1_thread = h1.clone();
    let seen = std::thread::spawn(move || h1_thread.current_stack())
        .join()
        .expect("thread");
    assert_eq!(seen, 0, "another thread has its own stack");
    drop(s2);
    drop(s1);
}

#[test]
fn a_name_buffer_reused_with_other_bytes_is_another_scope() {
    // Guards remember the scopes a site opened lately; a caller that formats names into one
    // buffer hands in the same address with other bytes, and must get the scope those bytes name.
    let rec = recorder("scopes-reused-buffer");
    let h = rec.handle();
    let mut names: Vec<(String, u32)> = Vec::new();
    let mut buf = String::with_capacity(32);
    for word in [
        "layer0",
        "layer1",
        "layer0",
        "x",
        "y",
        "abcdefghijk",
        "abcdefghijK",
        "Abcdefghijk",
    ] {
        buf.clear();
        buf.push_str(word);
        let stack = h.scope(&buf).stack();
        names.push((word.to_owned(), stack));
    }
    let path = h.path();
    rec.finish().expect("finish");

    let t = Trace::read(&path);
    for (word, stack) in &names {
        assert_eq!(t.names(*stack), [word.as_str()], "{word}");
    }
    assert_eq!(names[0].1, names[2].1, "layer0 twice is one scope");
    assert_eq!(t.stacks.len(), 7, "seven distinct names at one site");
}
