use super::compare::median;
use super::render::{change_text, code, value_text};
use super::rules::glob;
use super::*;
use crate::tables::diff_keys;

fn rule(s: &str) -> Rule {
    s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
}

fn problem(s: &str) -> RuleProblem {
    match s.parse::<Rule>() {
        Ok(r) => panic!("{s} parsed as {r:?}"),
        Err(e) => e.problem,
    }
}

fn run(figs: &[(&str, i64)]) -> Figures {
    let keys = diff_keys();
    let mut f = Figures::default();
    for &(k, v) in figs {
        let (scope, figure) = match k.split_once(':') {
            Some((scope, rest)) => (scope, rest.rsplit_once('.').expect("figure").1),
            None => ("", k),
        };
        let (section, key) = keys
            .iter()
            .find(|(_, d)| d.scope == scope && d.figure == figure)
            .expect("known figure");
        f.put(k.into(), *section, key.quantity, v);
    }
    f
}

#[test]
fn rules_parse_in_every_documented_form() {
    let r = rule("peak_used>+5%");
    assert_eq!(r.metric, "peak_used");
    assert_eq!(r.threshold, Threshold::Percent(5.0));
    assert!(!r.inclusive);
    let r = rule(" acquired >= 64MB ");
    assert_eq!(r.text, "acquired >= 64MB");
    assert_eq!(r.metric, "peak_acquired");
    assert_eq!(r.threshold, Threshold::Amount(64.0 * 1048576.0));
    assert!(r.inclusive);
    let r = rule("function:LinearFunction.used>+10%");
    assert_eq!(r.metric, "function:LinearFunction.used");
    assert_eq!(r.quantity, Quantity::Bytes);
    assert_eq!(rule("time>+20%").quantity, Quantity::Nanoseconds);
    assert_eq!(rule("time>100ms").threshold, Threshold::Amount(1e8));
    assert_eq!(rule("time>2s").threshold, Threshold::Amount(2e9));
    assert_eq!(rule("wall_time>1.5s").threshold, Threshold::Amount(1.5e9));
    assert_eq!(rule("allocations>100").threshold, Threshold::Amount(100.0));
    assert_eq!(
        rule("peak_used>1gib").threshold,
        Threshold::Amount(1073741824.0)
    );
    assert_eq!(rule("link:Linear.time>+1ms").metric, "link:Linear.time");
    assert_eq!(rule("epoch:2.gpu_peak>+1MB").metric, "epoch:2.gpu_peak");
    assert_eq!(rule("epoch:*.gpu_used>0").metric, "epoch:*.gpu_used");
    // Names keep their dots, colons and angle brackets.
    assert_eq!(
        rule("function:SGD.update.used>0").metric,
        "function:SGD.update.used"
    );
    assert_eq!(
        rule("line:a.py:3:<module>;b.py:9:f.used>+1KB").metric,
        "line:a.py:3:<module>;b.py:9:f.used"
    );
    assert_eq!(
        rule("function:<lambda>.used>5%").metric,
        "function:<lambda>.used"
    );
}

#[test]
fn malformed_rules_say_what_is_wrong() {
    assert_eq!(problem("peak_used+5%"), RuleProblem::NoOperator);
    assert_eq!(problem("peak_used<5%"), RuleProblem::Operator);
    assert_eq!(problem("peak_used>>5%"), RuleProblem::Operator);
    assert_eq!(problem(">5%"), RuleProblem::EmptyMetric);
    assert_eq!(problem("peak_used>"), RuleProblem::EmptyValue);
    assert_eq!(
        problem("peak_usd>5%"),
        RuleProblem::UnknownMetric("peak_usd".into())
    );
    assert!(matches!(
        problem("function:Linear>5%"),
        RuleProblem::NoFigure { .. }
    ));
    assert!(matches!(
        problem("function:Linear.bytes>5%"),
        RuleProblem::UnknownFigure { .. }
    ));
    assert!(matches!(
        problem("link:.time>5%"),
        RuleProblem::EmptyName(..)
    ));
    assert_eq!(
        problem("epoch:x.gpu_used>0"),
        RuleProblem::BadEpoch("x".into())
    );
    for v in [
        "5 apples", "%", "+", ".5%", "5.%", "1e9", "inf", "5%%", "64 XB",
    ] {
        assert_eq!(
            problem(&format!("peak_used>{v}")),
            RuleProblem::BadValue(v.into()),
            "{v}"
        );
    }
    assert!(matches!(
        problem("peak_used>100ms"),
        RuleProblem::UnitMismatch { .. }
    ));
    assert!(matches!(
        problem("time>64MB"),
        RuleProblem::UnitMismatch { .. }
    ));
    let e = "peak_usd>5%".parse::<Rule>().expect_err("unknown metric");
    assert!(e
        .to_string()
        .starts_with("bad rule `peak_usd>5%`: unknown metric"));
}

#[test]
fn wildcards_match_any_run_of_characters() {
    assert!(glob("function:*.used", "function:LinearFunction.used"));
    assert!(!glob(
        "function:*.used",
        "function:LinearFunction.self_used"
    ));
    assert!(glob("*", ""));
    assert!(glob("a*b*c", "aXbYbZc"));
    assert!(!glob("a*b*c", "aXbYbZ"));
    assert!(glob(
        "line:*:LinearFunction.used",
        "line:x.rs:1:MLP;y.rs:2:LinearFunction.used"
    ));
    assert!(rule("function:*.used>5%").matches("function:ReLU.used"));
    assert!(!rule("function:ReLU.used>5%").matches("function:ReLU2.used"));
}

#[test]
fn identical_runs_cross_no_rule_and_show_only_the_headline() {
    let a = run(&[("peak_used", 1000), ("function:F.used", 500), ("time", 10)]);
    let rules = [
        rule("peak_used>+0%"),
        rule("function:*.used>0"),
        rule("time>+0%"),
    ];
    let d = compare(std::slice::from_ref(&a), std::slice::from_ref(&a), &rules);
    assert!(!d.failed(), "{:?}", d.violations);
    assert!(d.unmatched_rules.is_empty());
    let shown = d.json(&ShowOptions::default());
    assert!(shown.rows.iter().all(|r| r.section == Section::HEADLINE));
    assert_eq!(shown.rows.len(), 2);
    let all = d.json(&ShowOptions {
        all: true,
        ..ShowOptions::default()
    });
    assert_eq!(all.rows.len(), 3);
    assert_eq!(all.rows[2].delta_pct, Some(0.0));
}

#[test]
fn growth_past_a_rule_is_a_violation_with_its_value() {
    let base = run(&[("peak_used", 1000), ("peak_acquired", 2048)]);
    let new = run(&[("peak_used", 1100), ("peak_acquired", 2048 + 65 * 1048576)]);
    let rules = [
        rule("peak_used>+5%"),
        rule("peak_used>+10%"),
        rule("peak_used>=+10%"),
        rule("acquired>+64MB"),
    ];
    let d = compare(&[base], &[new], &rules);
    let got: Vec<(&str, Change)> = d
        .violations
        .iter()
        .map(|v| (v.rule.as_str(), v.value))
        .collect();
    assert_eq!(
        got,
        [
            ("peak_used>+5%", Change::Percent(10.0)),
            ("peak_used>=+10%", Change::Percent(10.0)),
            ("acquired>+64MB", Change::Amount(65 * 1048576)),
        ]
    );
}

#[test]
fn added_and_removed_keys_and_growth_from_zero() {
    let base = run(&[("function:Old.used", 4096), ("function:Zero.used", 0)]);
    let new = run(&[("function:New.used", 4096), ("function:Zero.used", 1)]);
    let d = compare(&[base], &[new], &[rule("function:*.used>+1000%")]);
    let row = |k: &str| d.rows.iter().find(|r| &*r.key == k).expect(k);
    let added = row("function:New.used");
    assert_eq!(
        (added.base, added.new, added.delta),
        (None, Some(4096), 4096)
    );
    assert_eq!(
        (change_text(added), added.delta_pct),
        ("added".into(), None)
    );
    let removed = row("function:Old.used");
    assert_eq!(
        (removed.base, removed.new, removed.delta),
        (Some(4096), None, -4096)
    );
    assert_eq!(change_text(removed), "removed");
    assert_eq!(change_text(row("function:Zero.used")), "from 0");
    // Percent rules: growth from nothing is infinite; a removal is no growth.
    let keys: Vec<(&str, Change)> = d
        .violations
        .iter()
        .map(|v| (v.key.as_str(), v.value))
        .collect();
    assert_eq!(
        keys,
        [
            ("function:New.used", Change::FromZero),
            ("function:Zero.used", Change::FromZero)
        ]
    );
    let json = serde_json::to_value(d.json(&ShowOptions::default())).expect("json");
    assert_eq!(json["violations"][0]["value"], serde_json::Value::Null);
}

#[test]
fn sides_take_medians_so_one_slow_run_moves_nothing() {
    let t = |ns| run(&[("time", ns)]);
    let base = [t(100), t(101), t(99)];
    let new = [t(100), t(400), t(102)];
    let d = compare(&base, &new, &[rule("time>+20%")]);
    assert!(!d.failed());
    assert_eq!((d.rows[0].base, d.rows[0].new), (Some(100), Some(102)));
    assert_eq!(median(&mut [4, 1, 3, 2]), 2);
    assert_eq!(median(&mut [-3, -2]), -3);
    // A run without the key counts as 0.
    let d = compare(
        &[run(&[("function:F.used", 8)]), run(&[])],
        &[run(&[])],
        &[],
    );
    assert_eq!((d.rows[0].base, d.rows[0].new), (Some(4), None));
}

#[test]
fn rows_are_ordered_by_the_size_of_the_change() {
    let base = run(&[
        ("time", 5),
        ("peak_used", 1),
        ("function:A.used", 100),
        ("function:B.used", 100),
        ("function:B.occurrence", 1),
        ("epoch:1.gpu_used", 10),
    ]);
    let new = run(&[
        ("time", 5),
        ("peak_used", 1),
        ("function:A.used", 110),
        ("function:B.used", 50),
        ("function:B.occurrence", 9000),
        ("epoch:1.gpu_used", -10),
    ]);
    let d = compare(&[base], &[new], &[]);
    let keys: Vec<&str> = d.rows.iter().map(|r| &*r.key).collect();
    assert_eq!(
        keys,
        [
            "peak_used",
            "time",
            "function:B.used",
            "function:A.used",
            "function:B.occurrence",
            "epoch:1.gpu_used"
        ]
    );
    let epoch = d.rows.last().expect("epoch row");
    assert_eq!(epoch.delta_pct, Some(-200.0));
    assert_eq!(value_text(Quantity::Bytes, epoch.new), "-10.00B");
    let shown = d.shown(&ShowOptions {
        top: Some(1),
        ..ShowOptions::default()
    });
    let functions = shown
        .iter()
        .find(|s| s.section.as_str() == "functions")
        .expect("functions");
    assert_eq!(functions.rows.len(), 1);
    assert_eq!(functions.more, 2);
}

#[test]
fn unmatched_rules_are_reported() {
    let a = run(&[("peak_used", 1)]);
    let d = compare(
        std::slice::from_ref(&a),
        std::slice::from_ref(&a),
        &[rule("function:Typo.used>1%")],
    );
    assert_eq!(d.unmatched_rules, ["function:Typo.used>1%"]);
}

#[test]
fn rules_files_use_the_same_grammar() {
    let rules = parse_rules_file("# team limits\nfail_on = [\"peak_used > +5%\", \"time>+20%\"]\n")
        .expect("rules file");
    assert_eq!(rules.len(), 2);
    assert!(matches!(
        parse_rules_file("fail-on = []"),
        Err(RulesFileError::Toml(_))
    ));
    let e = parse_rules_file("fail_on = [\"time>+20%\", \"peak>1\"]").expect_err("bad rule");
    assert!(
        e.to_string()
            .starts_with("rule 2 of `fail_on`: bad rule `peak>1`"),
        "{e}"
    );
    assert_eq!(parse_rules_file("").expect("empty file").len(), 0);
}

#[test]
fn markdown_escapes_keys_and_leads_with_the_verdict() {
    let base = run(&[("peak_used", 100), ("function:a|b.used", 1)]);
    let new = run(&[("peak_used", 200), ("function:a|b.used", 2)]);
    let d = compare(&[base], &[new], &[rule("peak_used>+5%")]);
    let md = render_markdown(&d, &ShowOptions::default());
    assert!(md.contains("❌ **1 violation(s)**"), "{md}");
    assert!(md.contains("`function:a\\|b.used`"), "{md}");
    assert!(md.find("| rule |") < md.find("| headline |"));
    let table = render_table(&d, &ShowOptions::default());
    assert!(
        table.ends_with("  peak_used>+5%  peak_used  +100.00%\n"),
        "{table}"
    );
    assert_eq!(code("a`b"), "`` a`b ``");
}

#[test]
fn runs_and_rows_hold_each_key_once() {
    // Two runs made with one `Keys`: a key both have is one string, and the comparison's row
    // holds that string too (a copy per run and per row was most of a large diff's memory).
    let keys = Keys::default();
    let figure = |value| {
        let mut f = Figures::empty(&keys);
        f.put(
            "line:a.py:1:f;b.py:2:g.used".into(),
            Section("lines"),
            Quantity::Bytes,
            value,
        );
        f.put(
            "peak_used".into(),
            Section::HEADLINE,
            Quantity::Bytes,
            value,
        );
        f
    };
    let (base, new) = (figure(10), figure(20));
    let key = |f: &Figures| {
        f.by_key
            .keys()
            .find(|k| k.starts_with("line:"))
            .expect("the line key")
            .clone()
    };
    assert!(std::sync::Arc::ptr_eq(&key(&base), &key(&new)));
    let d = compare(std::slice::from_ref(&base), &[new], &[]);
    let row = d
        .rows
        .iter()
        .find(|r| r.key.starts_with("line:"))
        .expect("row");
    assert!(std::sync::Arc::ptr_eq(&row.key, &key(&base)));
    assert_eq!((row.base, row.new), (Some(10), Some(20)));
    // Runs made apart hold their own (nothing shared by accident between unrelated diffs).
    let apart = run(&[("peak_used", 1)]);
    let other = run(&[("peak_used", 1)]);
    let first = |f: &Figures| f.by_key.keys().next().expect("a key").clone();
    assert!(!std::sync::Arc::ptr_eq(&first(&apart), &first(&other)));
}
