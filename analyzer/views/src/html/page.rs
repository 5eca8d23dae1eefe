//! The page around a [`ReportData`]: the inlined style and script, and the data as a JSON
//! island the script reads. Every string from a trace (frame names, paths, the title) reaches
//! the page only inside that JSON, escaped so that it cannot end the `<script>` element, and
//! the script puts it into the document as text, never as markup.

use std::fmt::Write as _;

use super::ReportData;

const STYLE: &str = include_str!("assets/report.css");
/// The page's script: the parts in `assets/js/`, one job each, in this order inside one
/// function (they share its scope: `base.js` defines what the others use, `page.js` starts).
/// Strings from the trace only ever enter the document as text (textContent, canvas
/// fillText), never as markup.
const SCRIPT: &str = concat!(
    "\"use strict\";\n(function () {\n",
    include_str!("assets/js/base.js"),
    include_str!("assets/js/timeline.js"),
    include_str!("assets/js/flame.js"),
    include_str!("assets/js/tables.js"),
    include_str!("assets/js/categories.js"),
    include_str!("assets/js/phases.js"),
    include_str!("assets/js/page.js"),
    "})();\n"
);

/// The HTML page of a report.
pub fn render(data: &ReportData) -> String {
    // Serializing plain data structs cannot fail.
    let json = serde_json::to_string(data).unwrap_or_else(|_| "null".to_string());
    let mut page = String::with_capacity(json.len() + STYLE.len() + SCRIPT.len() + 4096);
    page.push_str(
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n",
    );
    let _ = writeln!(
        page,
        "<title>{}</title>",
        crate::timeline::escape(&data.title)
    );
    let _ = writeln!(page, "<style>\n{STYLE}</style>\n</head>\n<body>");
    page.push_str(BODY);
    let _ = writeln!(
        page,
        "<script id=\"poolsight-data\" type=\"application/json\">{}</script>",
        escape_json_for_script(&json)
    );
    let _ = writeln!(page, "<script>\n{SCRIPT}</script>\n</body>\n</html>");
    page
}

/// The static skeleton the script fills.
const BODY: &str = r#"<header>
<h1 id="title"></h1>
<div id="summary"></div>
<label id="rank-label" hidden>View <select id="rank"></select></label>
</header>
<main>
<section id="timeline-section">
<h2>Active memory over time</h2>
<p class="help">Live bytes stacked by memory category, by phase, by module or by the stack that
allocated them (each point is its time bucket's maximum, so the peak is exact), the bytes a pool
acquired as a line, epochs shaded. Wheel: zoom; drag: pan; hover: what a band is; click: what was live then.</p>
<div class="toolbar"><button id="go-peak">Go to peak</button> <button id="zoom-reset">Reset zoom</button>
<span id="stack-by" class="choice" hidden></span></div>
<div id="timelines"></div>
<div id="legend" class="legend"></div>
</section>
<section id="oom-section" hidden>
<h2>Why it ran out of memory</h2>
<p class="help">The allocator at the out-of-memory: what was asked, what was reserved and
free, the largest free block of each pool and stream, what was live, and which setting would
help (the text of <code>poolsight oom</code>).</p>
<pre id="oom-text" class="oom"></pre>
</section>
<section id="live-section">
<h2 id="live-title">Live at an instant</h2>
<p class="help">Click the timeline (or "Go to peak"): the bytes live at that instant, by the
stack that allocated them (the icicle) and as the timeline is stacked (the table).</p>
<div id="live-flame" class="flame"></div>
<table id="live-table" class="sortable"></table>
</section>
<section id="categories-section" hidden>
<h2>Memory by category</h2>
<p class="help">What the live bytes are, by the categories <code>poolsight.torch.track()</code>
records (PyTorch MemTracker's): at the peak of live bytes, over time (each point at its time bucket's
used maximum), and per module the bytes live as its highest call began and ended and at that
call's peak (MemTracker's Pre/Post/Peak-Forward), what its backward allocated and what it held at
the peak: the figures of <code>poolsight categories</code>.</p>
<h3>At the peak</h3>
<div id="category-peak" class="bar"></div>
<div id="category-key" class="legend"></div>
<h3>Over time</h3>
<div id="category-charts"></div>
<div id="category-tables"></div>
</section>
<section id="phases-section" hidden>
<h2>Memory by phase</h2>
<p class="help">What each phase of the run allocated that was still live at the peak of live
bytes, by category: the phase split of <code>poolsight categories</code>. Stack the timeline
by phase to see them over time.</p>
<p id="phase-note" class="help"></p>
<h3>At the peak</h3>
<div id="phase-peak"></div>
<div id="phase-tables"></div>
</section>
<section id="flame-section">
<h2 id="flame-title">Flamegraph</h2>
<div class="toolbar">
<span id="metrics"></span>
<input id="search" type="search" placeholder="Search frames (regex)">
<span id="search-result"></span>
<button id="flame-reset">Reset zoom</button>
</div>
<p id="flame-note" class="help" hidden></p>
<div id="flame" class="flame"></div>
</section>
<section id="tables-section">
<h2>Tables</h2>
<div id="tables"></div>
</section>
</main>
<div id="tooltip" hidden></div>
"#;

/// JSON that stays JSON (`JSON.parse` reads the same value) but holds no `<`, `>` or `&`, so
/// no `</script>` or `<!--` can end or change the element it sits in, and no U+2028/U+2029.
fn escape_json_for_script(json: &str) -> String {
    let mut out = String::with_capacity(json.len());
    for c in json.chars() {
        match c {
            '<' => out.push_str("\\u003c"),
            '>' => out.push_str("\\u003e"),
            '&' => out.push_str("\\u0026"),
            '\u{2028}' => out.push_str("\\u2028"),
            '\u{2029}' => out.push_str("\\u2029"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostile_strings_cannot_leave_the_json_island() {
        let hostile = "</script><img src=x onerror=alert(1)><!--";
        let data = ReportData {
            title: hostile.to_string(),
            frames: vec![hostile.to_string()],
            runs: Vec::new(),
            views: Vec::new(),
            diff: None,
            observed: false,
            oom: Some(hostile.to_string()),
        };
        let page = render(&data);
        assert!(!page.contains("<img"), "no markup from the data");
        assert!(!page.contains("<!--"));
        assert_eq!(page.matches("</script>").count(), 2, "only the page's own");
        assert!(page.contains("<title>&lt;/script&gt;&lt;img src=x"));
        let island = page
            .split("type=\"application/json\">")
            .nth(1)
            .and_then(|s| s.split("</script>").next())
            .expect("json island");
        let back: serde_json::Value = serde_json::from_str(island).expect("valid JSON");
        assert_eq!(back["frames"][0], hostile);
    }
}
