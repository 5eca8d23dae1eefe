//! `poolsight diff`: argument parsing and rendering over [`poolsight::analyzer::diff`].

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::{Args, ValueEnum};
use poolsight::analyzer::diff::{self, Figures, Keys, Rule, Section, ShowOptions, Timeline};
use poolsight::analyzer::load::incomplete;
use poolsight::analyzer::tables::{self, Report, ReportOptions};
use poolsight::analyzer::views::flamegraph::{self, FlameError, Metric};
use poolsight::analyzer::whatif::{Recorded, Settings};
use poolsight::analyzer::{views::html, Profile, ReplayOptions, Trace};

use super::load::Reading;
use super::output;
use super::whatif::{parse_bytes, parse_setting};

const HELP: &str = "\
Rows are matched by name (functions, links, file:line:function stacks, epoch numbers; never
addresses). By default: the headline (peak used/acquired bytes, allocations, wall time); where
they part (the first point the new run holds more live bytes than the base by more than the
tightest peak_used rule, else 1% of the base's peak; lined up step by step, else by the share
of the run elapsed); what was live at each run's peak, by category and by innermost user line
(peak.category.NAME, peak.line.FILE:LINE:FUNCTION > OPERATOR, the stack behind it in JSON and
folded in markdown); then functions, timers, epochs and whatif. --section lines shows the
cumulative bytes of every request by whole stack, --section categories by category. Each row's
key is what a rule names. Unchanged rows are hidden unless --all; the headline is always shown.
The table fits 160 columns and markdown lines 200 characters (long keys shortened, kept
unique); JSON keeps keys whole.

Several runs per side: --base B1 B2 B3 --new N1 N2 N3 (shell globs work). Each figure is the
median over a side's runs, so one slow run on a noisy machine does not fail a time rule.

Rules (--fail-on, repeatable; --rules FILE with fail_on = [\"RULE\", ...]):
  METRIC>VALUE   fails when METRIC grew by more than VALUE (METRIC>=VALUE: by VALUE or more)
  METRIC  peak_used, peak_acquired (alias acquired), allocations, device_allocations,
          out_of_memory, time (wall time, alias wall_time), peak.category.NAME, peak.line.LINE,
          function:NAME.used|acquired|self_used|self_acquired|occurrence|time,
          link:NAME.time|occurrence, line:STACK.used|acquired, epoch:N.gpu_used|gpu_peak|
          cpu_used|cpu_peak, whatif:DEVICE.reserved_peak|fragmentation|failures|min_capacity|..;
          `*` matches any characters (function:*.used: every function)
  VALUE   +5% (of the base; growth from 0 crosses any percentage), +64MB (B, KB, MB, GB, TB;
          1024 steps), +100ms (ns, us, ms, s, min), or a plain number (bytes, ns or a count)

What would fit (--whatif): each run also replayed through the model of PyTorch's caching
allocator (`poolsight whatif`), under its recorded settings, or --setting K:V on both sides,
or --base-setting / --new-setting one per side (the same file twice compares two settings);
the whatif section gives per device whatif:DEVICE.reserved_peak, allocated_peak,
fragmentation, inactive_split, min_capacity (bytes) and failures (requests that do not fit
--capacity, else the trace's device).

Exit status: 0 no rule crossed, 1 a rule crossed (each violation listed), 2 bad input.

Examples:
  poolsight diff base.pstrace new.pstrace --fail-on 'peak_used>+5%'
  poolsight diff base.pickle new.pickle --fail-on 'peak.category.activation>+5%' --section lines
  poolsight diff run.pickle run.pickle --base-setting max_split_size_mb:128 \\
      --new-setting expandable_segments:True --fail-on 'whatif:*.reserved_peak>0'
  poolsight diff --base base-*.pstrace --new new-*.pstrace --rules poolsight-rules.toml \\
      --format markdown --top 15 > comment.md";

#[derive(Copy, Clone, PartialEq, Eq, ValueEnum)]
pub enum DiffFormat {
    Table,
    /// Ready to post as a pull-request comment.
    Markdown,
    Json,
}

/// `poolsight diff`'s arguments; the rules grammar is in `--help`.
#[derive(Args)]
#[command(after_long_help = HELP, after_help = "Rules and examples: see --help.")]
pub struct DiffArgs {
    /// BASE NEW: one trace per side (or use --base/--new).
    #[arg(num_args = 2, value_names = ["BASE", "NEW"], conflicts_with_all = ["base", "new"])]
    pub traces: Vec<PathBuf>,
    /// Base run(s): one trace per run of the same job; figures are medians over them.
    #[arg(long, num_args = 1.., value_name = "TRACE", requires = "new")]
    pub base: Vec<PathBuf>,
    /// New run(s), as --base.
    #[arg(long, num_args = 1.., value_name = "TRACE", requires = "base")]
    pub new: Vec<PathBuf>,
    /// A rule that fails the run when crossed, e.g. 'peak_used>+5%' (repeatable).
    #[arg(long = "fail-on", value_name = "RULE", value_parser = parse_rule)]
    pub fail_on: Vec<Rule>,
    /// A TOML file of rules: fail_on = ["peak_used>+5%", "time>+20%"].
    #[arg(long, value_name = "FILE")]
    pub rules: Option<PathBuf>,
    #[arg(long, value_enum, default_value_t = DiffFormat::Table)]
    pub format: DiffFormat,
    /// Show unchanged rows too.
    #[arg(long)]
    pub all: bool,
    /// At most N rows per section (the headline is always whole; rules still see every row).
    #[arg(long, value_name = "N")]
    pub top: Option<usize>,
    /// Write a differential flamegraph of the calling-context trees (widths: the new run;
    /// red: grew, blue: shrank). With several runs, the first of each side.
    #[arg(long, value_name = "F.svg")]
    pub flamegraph: Option<PathBuf>,
    /// Compare runs that are partial (unfinished, torn, dropped events or empty) instead of
    /// refusing them with exit code 2; the report names the partial side.
    #[arg(long)]
    pub allow_incomplete: bool,
    /// Write an interactive HTML page: both runs' timelines on one axis, the differential
    /// flamegraph (any metric), each run's tables. With several runs, the first of each side.
    #[arg(long, value_name = "F.html")]
    pub html: Option<PathBuf>,
    /// Also replay each run through the model of PyTorch's caching allocator, under its
    /// recorded settings: the whatif section (see --help).
    #[arg(long)]
    pub whatif: bool,
    /// Replay both sides under this setting, over their recorded ones (implies --whatif).
    #[arg(long, value_name = "K:V[,K:V]", value_parser = parse_setting, conflicts_with_all = ["base_setting", "new_setting"])]
    pub setting: Option<Settings>,
    /// Replay the base side under this setting (implies --whatif).
    #[arg(long, value_name = "K:V[,K:V]", value_parser = parse_setting)]
    pub base_setting: Option<Settings>,
    /// Replay the new side under this setting (implies --whatif).
    #[arg(long, value_name = "K:V[,K:V]", value_parser = parse_setting)]
    pub new_setting: Option<Settings>,
    /// The device memory the replays may take (16GiB, 80GB, ...; implies --whatif); default:
    /// each trace's own.
    #[arg(long, value_name = "BYTES", value_parser = parse_bytes)]
    pub capacity: Option<u64>,
    /// Show these sections beside the headline (repeatable): peak, functions, lines, timers,
    /// epochs, categories, whatif. Default: all but lines and categories (cumulative bytes
    /// of every request by whole stack, and by category) — what was live at each run's peak
    /// is the peak section. Rules see every section whatever is shown.
    #[arg(long = "section", value_name = "NAME", value_parser = parse_section)]
    pub sections: Vec<Section>,
    /// What the flamegraph measures: used, acquired, peak or time.
    #[arg(long, default_value = "used", value_parser = parse_metric, requires = "flamegraph")]
    pub flamegraph_metric: Metric,
}

fn parse_rule(s: &str) -> Result<Rule, String> {
    s.parse().map_err(|e: diff::RuleError| e.to_string())
}

fn parse_section(s: &str) -> Result<Section, String> {
    let all = Section::all();
    all.iter()
        .copied()
        .find(|x| x.as_str() == s && *x != Section::HEADLINE)
        .ok_or_else(|| {
            let names: Vec<&str> = (all.iter())
                .filter(|x| **x != Section::HEADLINE)
                .map(|x| x.as_str())
                .collect();
            format!(
                "no section `{s}`; the sections are {} (the headline is always shown)",
                names.join(", ")
            )
        })
}

fn parse_metric(s: &str) -> Result<Metric, String> {
    s.parse()
        .map_err(|e: flamegraph::ParseMetricError| e.to_string())
}

/// The base and new traces, from either form of the command line.
fn sides(args: &DiffArgs) -> anyhow::Result<(&[PathBuf], &[PathBuf])> {
    match args.traces.as_slice() {
        [] if !args.base.is_empty() && !args.new.is_empty() => Ok((&args.base, &args.new)),
        [base, new] => Ok((std::slice::from_ref(base), std::slice::from_ref(new))),
        _ => anyhow::bail!(
            "diff needs two traces, BASE NEW, or several runs per side with --base ... --new ..."
        ),
    }
}

fn read_rules(path: &Path) -> anyhow::Result<Vec<Rule>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read rules file {}", path.display()))?;
    diff::parse_rules_file(&text).with_context(|| format!("{}", path.display()))
}

/// Each run's figures, and the first run's trace and profile when a flamegraph or the HTML
/// page will need them. A side's traces are runs of one job (their figures are medians), not
/// the ranks of one run: each is loaded on its own, so rank 0 of two runs is no duplicate.
struct Side {
    figures: Vec<Figures>,
    /// The first run's live bytes over time, for "where they part".
    timeline: Option<Timeline>,
    first: Option<(Trace, Profile)>,
    /// What makes this side partial, if anything.
    partial: Option<String>,
}

/// How a side is replayed through the allocator model, when it is.
struct Whatif<'a> {
    setting: Option<&'a Settings>,
    capacity: Option<u64>,
}

/// The figures of each run at `paths`, their keys held in `keys` (once for every run of
/// both sides).
fn figures(
    paths: &[PathBuf],
    keep_first: bool,
    r: &Reading,
    model: Option<&Whatif>,
    keys: &Keys,
) -> anyhow::Result<Side> {
    let opts = ReportOptions::default();
    let mut first = None;
    let mut timeline = None;
    let mut figures = Vec::new();
    let mut sources = Vec::new();
    for (i, path) in paths.iter().enumerate() {
        // Every run walks to its peak: the `line:*.live_at_peak` figures say which stacks a
        // peak's growth came from (and the HTML page and a peak flamegraph draw them).
        let replay = ReplayOptions {
            live_at_peak: true,
            ..ReplayOptions::default()
        };
        // One path: one trace and its profile, or an error; read once for the model too (a
        // converted snapshot's trace keeps its allocator settings).
        let inputs = r.inputs(std::slice::from_ref(path))?;
        let mut loaded = r.load_inputs(&inputs, replay)?;
        let (trace, profile) = (loaded.traces.swap_remove(0), loaded.profiles.swap_remove(0));
        sources.extend(profile.sources.iter().cloned());
        let mut f = Figures::sharing(&Report::compute(&profile, &opts), keys);
        if let Some(m) = model {
            let recorded = Recorded::of_trace(&trace);
            let w = tables::whatif_figures::figures(&trace, &recorded, m.setting, m.capacity);
            f.by_key.extend(w.by_key);
        }
        figures.push(f);
        if i == 0 {
            timeline = Timeline::of(&profile);
            if keep_first {
                first = Some((trace, profile));
            }
        }
    }
    Ok(Side {
        figures,
        timeline,
        first,
        partial: incomplete::describe(&sources),
    })
}

pub fn run(args: DiffArgs, r: &Reading, out: &mut dyn Write) -> anyhow::Result<u8> {
    let (base_paths, new_paths) = sides(&args)?;
    let mut rules = args.fail_on.clone();
    if let Some(path) = &args.rules {
        rules.extend(read_rules(path)?);
    }
    let keep = args.flamegraph.is_some() || args.html.is_some();
    let whatif = args.whatif
        || args.setting.is_some()
        || args.base_setting.is_some()
        || args.new_setting.is_some()
        || args.capacity.is_some();
    let base_model = Whatif {
        setting: args.base_setting.as_ref().or(args.setting.as_ref()),
        capacity: args.capacity,
    };
    let new_model = Whatif {
        setting: args.new_setting.as_ref().or(args.setting.as_ref()),
        capacity: args.capacity,
    };
    let keys = Keys::default();
    let base_side = figures(base_paths, keep, r, whatif.then_some(&base_model), &keys)?;
    let new_side = figures(new_paths, keep, r, whatif.then_some(&new_model), &keys)?;
    let partial: Vec<String> = [("base", &base_side.partial), ("new", &new_side.partial)]
        .iter()
        .filter_map(|(side, p)| p.as_ref().map(|p| format!("{side} run is partial: {p}")))
        .collect();
    if !partial.is_empty() && !args.allow_incomplete {
        anyhow::bail!(
            "{}; pass --allow-incomplete to compare anyway",
            partial.join("; ")
        );
    }
    let (base_profile, new_profile) = (base_side.first, new_side.first);
    let mut d = diff::compare(&base_side.figures, &new_side.figures, &rules);
    if let (Some(b), Some(n)) = (&base_side.timeline, &new_side.timeline) {
        d.parting = Some(diff::parting::parting(
            b,
            n,
            diff::parting::margin(&rules, b.peak_bytes),
        ));
    }

    if let (Some(path), Some((_, b)), Some((_, n))) =
        (&args.flamegraph, &base_profile, &new_profile)
    {
        let title = format!(
            "poolsight diff: {} (red: grew, blue: shrank)",
            args.flamegraph_metric
        );
        match flamegraph::differential_svg(b, n, args.flamegraph_metric, &title) {
            Ok(svg) => super::output::write_file(path, &svg)?,
            // A run with nothing to draw must not hide the verdict a CI job is waiting for.
            Err(e @ FlameError::Empty { .. }) => {
                eprintln!("poolsight: warning: no flamegraph written: {e}")
            }
            Err(e) => return Err(e).context("differential flamegraph"),
        }
    }

    if let (Some(path), Some(b), Some(n)) = (&args.html, &base_profile, &new_profile) {
        let title = format!(
            "poolsight diff: {} vs {}",
            base_paths[0].display(),
            new_paths[0].display()
        );
        let page = html::diff_page(&title, (&b.0, &b.1), (&n.0, &n.1));
        super::output::write_file(path, page.as_bytes())?;
    }

    let show = ShowOptions {
        all: args.all,
        top: args.top,
        sections: args.sections.clone(),
    };
    match args.format {
        DiffFormat::Table | DiffFormat::Markdown => {
            for p in &partial {
                writeln!(out, "warning: {p}\n")?;
            }
            if whatif {
                let under = |m: &Whatif| {
                    m.setting.map_or("its recorded settings".to_string(), |s| {
                        format!("{} over its recorded settings", s.label())
                    })
                };
                writeln!(
                    out,
                    "whatif: each run replayed through PyTorch's caching allocator; base under {}, new under {}\n",
                    under(&base_model),
                    under(&new_model)
                )?;
            }
        }
        DiffFormat::Json => {
            for p in &partial {
                eprintln!("poolsight: warning: {p}");
            }
        }
    }
    // Written as it is made: with --all on a large run the whole text would cost more memory
    // than the comparison (buffered: standard output flushes at every line).
    let written = (|| -> anyhow::Result<()> {
        let mut text = std::io::BufWriter::with_capacity(1 << 16, &mut *out);
        match args.format {
            DiffFormat::Table => {
                output::write_text(&mut text, |w| diff::write_table(w, &d, &show))?
            }
            DiffFormat::Markdown => {
                output::write_text(&mut text, |w| diff::write_markdown(w, &d, &show))?
            }
            DiffFormat::Json => {
                let mut json = d.json(&show);
                json.partial = partial;
                output::write_json(&mut text, &json)?;
            }
        }
        text.flush()?;
        Ok(())
    })();
    match written {
        // The verdict stands when the reader stopped reading (`| head`).
        Err(e) if super::closed_pipe(&e) => return Ok(if d.failed() { 1 } else { 0 }),
        other => other?,
    }
    if args.format != DiffFormat::Table {
        for r in &d.unmatched_rules {
            eprintln!("poolsight: warning: rule `{r}` matched no figure of either run");
        }
    }
    out.flush()?;
    Ok(if d.failed() { 1 } else { 0 })
}
