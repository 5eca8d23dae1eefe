use super::reader::Item;
use super::*;

type V = Value<Infallible>;

fn parse(b: &[u8]) -> Result<Parsed<Infallible>, PickleError> {
    super::parse(b, &[], &mut Plain, None)
}

#[test]
fn protocol_2_dict_of_list() {
    // pickle.dumps({'a': [1, 'x', None, True]}, protocol=2)
    let b = b"\x80\x02}q\x00X\x01\x00\x00\x00aq\x01]q\x02(K\x01X\x01\x00\x00\x00xq\x03N\x88es.";
    let p = parse(b).unwrap();
    let s = &p.store;
    let items = s.items(s.get(p.root, "a").unwrap());
    assert_eq!(items.len(), 4);
    assert_eq!(items[0].u64(), Some(1));
    assert_eq!(s.str(items[1]), Some("x"));
    assert_eq!(items[2], V::None);
    assert_eq!(items[3].bool(), Some(true));
}

#[test]
fn long1_values() {
    // LONG1 of 2**63 (9 bytes), -1 (1 byte), 2**40
    let b = b"\x80\x02(\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x80\x00\x8a\x01\xff\x8a\x06\x00\x00\x00\x00\x00\x01t.";
    let p = parse(b).unwrap();
    let v = p.store.items(p.root);
    assert_eq!(v[0].u64(), Some(1 << 63));
    assert_eq!(v[1].i64(), Some(-1));
    assert_eq!(v[2].u64(), Some(1 << 40));
}

#[test]
fn memoized_containers_are_shared() {
    // a = []; pickle.dumps([a, a], protocol=2): the second `a` is a GET of the first while
    // both wait for the outer APPENDS.
    let p = parse(b"\x80\x02]q\x00(]q\x01h\x01e.").unwrap();
    let v = p.store.items(p.root);
    assert_eq!(v.len(), 2);
    assert_eq!(v[0], v[1]);
    // d = {'x': {'f': 1}}; d['y'] = d['x']; pickle.dumps(d, protocol=4)
    let b = b"\x80\x04\x95\x18\x00\x00\x00\x00\x00\x00\x00}\x94(\x8c\x01x\x94}\x94\x8c\x01f\x94K\x01s\x8c\x01y\x94h\x02u.";
    let p = parse(b).unwrap();
    let (x, y) = (p.store.get(p.root, "x"), p.store.get(p.root, "y"));
    assert_eq!(x, y);
    assert_eq!(p.store.get(x.unwrap(), "f").and_then(|v| v.u64()), Some(1));
    // Strings are interned: the key and the text of `x` are one id.
    assert_eq!(p.store.str(p.store.items(p.root)[0]), Some("x"));
}

#[test]
fn keys_are_interned_first() {
    let b = b"\x80\x02}q\x00X\x01\x00\x00\x00aK\x01s.";
    let p = super::parse(b, &["zero", "a"], &mut Plain, None).unwrap();
    assert_eq!(p.store.items(p.root)[0], V::Str(1));
}

/// A value as text, containers recursively.
fn show(p: &Parsed<Infallible>, v: V) -> String {
    let s = &p.store;
    let all = |v: V| -> Vec<String> { s.items(v).iter().map(|&x| show(p, x)).collect() };
    match v {
        V::Str(_) => format!("{:?}", s.str(v).unwrap_or_default()),
        V::List(_) => format!("[{}]", all(v).join(", ")),
        V::Tuple(_) => format!("({})", all(v).join(", ")),
        V::Dict(_) => {
            let kv = all(v);
            let pairs: Vec<String> = kv.chunks(2).map(|p| p.join(": ")).collect();
            format!("{{{}}}", pairs.join(", "))
        }
        other => format!("{other:?}"),
    }
}

#[test]
fn the_fast_path_of_flat_dicts_reads_as_the_general_one() {
    // f1 = {'filename': 'a.py', 'line': 3, 'name': 'f'}; f2 = {..., 'line': 300, ...}
    // obj = {'frames': [dict(f1), dict(f2), dict(f1), dict(f1)], 'n': [None, True, -5, 2.5]}
    // protocol 4 (the fast path, the last frame remembered from the third) and 0 (none).
    let p4 = b"\x80\x04\x95\x8c\x00\x00\x00\x00\x00\x00\x00}\x94(\x8c\x06frames\x94]\x94(}\x94(\x8c\x08filename\x94\x8c\x04a.py\x94\x8c\x04line\x94K\x03\x8c\x04name\x94\x8c\x01f\x94u}\x94(h\x04\x8c\x04b.py\x94h\x06M,\x01h\x07\x8c\x01g\x94u}\x94(h\x04h\x05h\x06K\x03h\x07h\x08u}\x94(h\x04h\x05h\x06K\x03h\x07h\x08ue\x8c\x01n\x94]\x94(N\x88J\xfb\xff\xff\xffG@\x04\x00\x00\x00\x00\x00\x00eu.";
    let p0 = b"(dp0\nVframes\np1\n(lp2\n(dp3\nVfilename\np4\nVa.py\np5\nsVline\np6\nI3\nsVname\np7\nVf\np8\nsa(dp9\ng4\nVb.py\np10\nsg6\nI300\nsg7\nVg\np11\nsa(dp12\ng4\ng5\nsg6\nI3\nsg7\ng8\nsa(dp13\ng4\ng5\nsg6\nI3\nsg7\ng8\nsasVn\np14\n(lp15\nNaI01\naI-5\naF2.5\nas.";
    let (a, b) = (parse(p4).unwrap(), parse(p0).unwrap());
    let text = show(&a, a.root);
    assert_eq!(text, show(&b, b.root));
    assert!(
        text.contains(r#"{"filename": "b.py", "line": Int(300), "name": "g"}"#),
        "{text}"
    );
}

#[test]
fn a_replaced_memo_entry_is_read_again() {
    // [] ; 1 PUT 5 POP ; {'k': GET 5} APPEND ; 2 PUT 5 POP ; {'k': GET 5} APPEND: the
    // second dict has the bytes of the first, but memo 5 holds 2 by then.
    let b = b"\x80\x04]K\x01q\x050}(\x8c\x01kh\x05uaK\x02q\x050}(\x8c\x01kh\x05ua.";
    let p = parse(b).unwrap();
    assert_eq!(show(&p, p.root), r#"[{"k": Int(1)}, {"k": Int(2)}]"#);
}

#[test]
fn a_container_that_holds_itself_is_refused() {
    // l = []; l.append(l); pickle.dumps(l, protocol=2)
    let e = parse(b"\x80\x02]q\x00h\x00a.").unwrap_err();
    assert!(e.what.contains("already complete"), "{e}");
}

#[test]
fn globals_and_calls_are_refused() {
    // pickle.dumps of an object whose __reduce__ returns (os.system, ('echo hi',)), protocol 2
    let b = b"\x80\x02cposix\nsystem\nq\x00X\x07\x00\x00\x00echo hiq\x01\x85q\x02Rq\x03.";
    let e = parse(b).unwrap_err();
    assert!(e.what.contains("posix.system"), "{e}");
    // protocol 4 uses STACK_GLOBAL
    let b = b"\x80\x04\x95\x1e\x00\x00\x00\x00\x00\x00\x00\x8c\x05posix\x94\x8c\x06system\x94\x93\x94\x8c\x07echo hi\x94\x85\x94R\x94.";
    let e = parse(b).unwrap_err();
    assert!(e.what.contains("posix.system"), "{e}");
    assert!(parse(b"\x80\x02N\x85R.")
        .unwrap_err()
        .what
        .contains("REDUCE"));
}

#[test]
fn damaged_input_is_an_error() {
    for bad in [
        &b""[..],
        b"\x80\x02",
        b"\x80\x02X\xff\xff\xff\x7f",
        b"\x80\x02\x8d\xff\xff\xff\xff\xff\xff\xff\xff",
        b"\x80\x02h\x05.",
        b"\x80\x02e.",
        b"\x80\x02u.",
        b"\x80\x02}K\x01s.",
        b"\x80\x02N.extra",
        b"\x80\x02r\xff\xff\xff\xff",
        b"\x80\x02(N0.",
        b"\x80\x02N(a.",
        b"\x80\x02(.",
        b"\xfe",
    ] {
        assert!(parse(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn nesting_is_bounded() {
    let mut deep = b"\x80\x02".to_vec();
    deep.resize(MAX_STACK + 3, b']');
    let e = parse(&deep).unwrap_err();
    assert!(e.what.contains("nested too deep"), "{e}");
    let mut marks = b"\x80\x02".to_vec();
    marks.resize(MAX_STACK + 3, b'(');
    assert!(parse(&marks).unwrap_err().what.contains("nested too deep"));
}

#[test]
fn protocol_0_text() {
    // pickle.dumps({'k': [1, 2.5, 'é']}, protocol=0)
    let b = b"(dp0\nVk\np1\n(lp2\nI1\naF2.5\naV\\u00e9\np3\nas.";
    let p = parse(b).unwrap();
    let l = p.store.items(p.store.get(p.root, "k").unwrap());
    assert_eq!(l[0].u64(), Some(1));
    assert_eq!(l[1].f64(), Some(2.5));
    assert_eq!(p.store.str(l[2]), Some("é"));
}

#[test]
fn values_stay_small() {
    assert!(std::mem::size_of::<Item<Infallible>>() <= 16);
    assert!(std::mem::size_of::<Option<Item<(u32, u32)>>>() <= 16);
}
