//! The report tables: `info`, `functions`, `lines`, `timers`, `epochs`, `categories`, `report`.

use std::io::Write;
use std::path::PathBuf;

use clap::Args;
use poolsight::analyzer::load::{views, Loaded};
use poolsight::analyzer::replay::CategoryPass;
use poolsight::analyzer::tables::functions::{self, Unit};
use poolsight::analyzer::tables::timers::{self, TimeUnit, Which};
use poolsight::analyzer::tables::{categories, epochs, info, lines, Report, ReportOptions};
use poolsight::analyzer::ReplayOptions;

use super::args::{parse_table, parse_time_unit, parse_unit, table_names, Format, Input};
use super::load::Reading;
use super::output::emit;

#[derive(Args)]
pub struct InfoArgs {
    /// Trace file(s) (*.pstrace).
    #[arg(required = true)]
    traces: Vec<PathBuf>,
    #[arg(long, value_enum, default_value_t = Format::Table)]
    format: Format,
}

pub fn info(args: InfoArgs, r: &Reading, out: &mut impl Write) -> anyhow::Result<()> {
    let mut infos = Vec::new();
    for path in &args.traces {
        // As every report loads a trace: checksums checked as the replay reads each chunk,
        // the whole file checked first only if one fails. The warnings go to stderr as for
        // every command, and `info` lists them too.
        let opts = ReplayOptions {
            categories: CategoryPass::Never,
            ..ReplayOptions::default()
        };
        let loaded = r.load(std::slice::from_ref(path), opts)?;
        let (trace, profile) = (&loaded.traces[0], &loaded.profiles[0]);
        let mut i = info::info(trace);
        info::add_replay(&mut i, profile);
        infos.push(i);
    }
    match args.format {
        Format::Csv => write!(out, "{}", info::render_csv(&infos))?,
        Format::Table => {
            for (n, i) in infos.iter().enumerate() {
                if n > 0 {
                    writeln!(out)?;
                }
                write!(out, "{}", info::render_table(i))?;
            }
        }
        Format::Json => {
            let json = if infos.len() == 1 {
                serde_json::to_string_pretty(&infos[0])?
            } else {
                serde_json::to_string_pretty(&infos)?
            };
            writeln!(out, "{json}")?;
        }
    }
    Ok(())
}

#[derive(Args)]
pub struct FunctionsArgs {
    #[command(flatten)]
    input: Input,
    /// auto (one unit per column, from its largest value), auto_foreach (one per cell), or
    /// B, KB, MB, GB, TB, PB, EB, ZB.
    #[arg(long, default_value = "auto", value_parser = parse_unit)]
    unit: Unit,
    /// Add exclusive columns: bytes of the function's own mallocs, not its callees'.
    #[arg(long = "self")]
    with_self: bool,
}

pub fn functions(args: FunctionsArgs, r: &Reading, out: &mut impl Write) -> anyhow::Result<()> {
    let v = r.computed(&args.input, CategoryPass::Never, functions::functions)?;
    emit(
        out,
        args.input.format,
        &v,
        |f| functions::render_table(f, args.unit, args.with_self),
        functions::render_csv,
    )
}

#[derive(Args)]
pub struct LinesArgs {
    #[command(flatten)]
    input: Input,
    /// Keep the outermost N-1 levels under _root (0: no limit), as CuPy's max_depth.
    #[arg(long, default_value_t = 0)]
    max_depth: usize,
}

pub fn lines(args: LinesArgs, r: &Reading, out: &mut impl Write) -> anyhow::Result<()> {
    let v = r.computed(&args.input, CategoryPass::Never, |p| {
        lines::lines(p, args.max_depth)
    })?;
    emit(
        out,
        args.input.format,
        &v,
        lines::render_table,
        lines::render_csv,
    )
}

#[derive(Args)]
pub struct TimersArgs {
    #[command(flatten)]
    input: Input,
    /// Only the link table (in JSON and CSV too).
    #[arg(long, conflicts_with = "functions")]
    links: bool,
    /// Only the function table (in JSON and CSV too).
    #[arg(long)]
    functions: bool,
    /// auto (one unit for the table, from its largest time, as Chainer), auto_foreach (one
    /// per row), sec, ms, us or ns.
    #[arg(long, default_value = "auto", value_parser = parse_time_unit)]
    unit: TimeUnit,
}

pub fn timers(args: TimersArgs, r: &Reading, out: &mut impl Write) -> anyhow::Result<()> {
    let which = match (args.links, args.functions) {
        (true, _) => Which::Links,
        (_, true) => Which::Functions,
        _ => Which::Both,
    };
    let v = r.computed(&args.input, CategoryPass::Never, timers::timers)?;
    // JSON and CSV hold the table(s) asked for, as the text does.
    let shown: Vec<(String, timers::Shown)> = v
        .iter()
        .map(|(name, t)| (name.clone(), timers::Shown { timers: t, which }))
        .collect();
    emit(
        out,
        args.input.format,
        &shown,
        |s| timers::render_table(s.timers, which, args.unit),
        |s| timers::render_csv_of(s.timers, which),
    )
}

#[derive(Args)]
pub struct EpochsArgs {
    #[command(flatten)]
    input: Input,
}

pub fn epochs(args: EpochsArgs, r: &Reading, out: &mut impl Write) -> anyhow::Result<()> {
    let v = r.computed(&args.input, CategoryPass::Never, epochs::epochs)?;
    emit(
        out,
        args.input.format,
        &v,
        epochs::render_table,
        epochs::render_csv,
    )
}

#[derive(Args)]
pub struct CategoriesArgs {
    #[command(flatten)]
    input: Input,
    /// A category of your own: allocations with a frame (`file:line:function`) that REGEX
    /// matches are NAME, before any recorded or inferred category. Repeatable; the first rule
    /// that matches wins. Example: --category 'attention=attn|MultiheadAttention'.
    #[arg(long = "category", value_name = "NAME=REGEX")]
    rules: Vec<poolsight::analyzer::replay::CategoryRule>,
}

pub fn categories(args: CategoriesArgs, r: &Reading, out: &mut impl Write) -> anyhow::Result<()> {
    let opts = poolsight::analyzer::ReplayOptions {
        categories: CategoryPass::Always,
        category_rules: args.rules.into(),
        // The categories' walk passes the peak: what was live there (split by phase) is free.
        live_at_peak: true,
        ..Default::default()
    };
    let v: Vec<(String, categories::Categories)> = r
        .views(&args.input, opts)?
        .into_iter()
        .map(|v| (v.heading, categories::categories(&v.profile)))
        .collect();
    emit(
        out,
        args.input.format,
        &v,
        categories::render_table,
        categories::render_csv,
    )
}

#[derive(Args)]
pub struct ReportArgs {
    #[command(flatten)]
    input: Input,
    /// With --format csv: which table to write (a CSV file holds one table): summary,
    /// functions, lines, timers, epochs or categories. Each command's own --format csv gives
    /// the same.
    #[arg(long, value_parser = parse_table)]
    table: Option<&'static str>,
}

pub fn report(args: ReportArgs, r: &Reading, out: &mut impl Write) -> anyhow::Result<()> {
    let input = &args.input;
    let table = match (input.format, args.table) {
        (Format::Csv, Some(t)) => t,
        (Format::Csv, None) => anyhow::bail!(
            "report --format csv writes one table: choose it with --table {}",
            table_names()
        ),
        (_, Some(_)) => anyhow::bail!("--table chooses a CSV table: use it with --format csv"),
        (_, None) => "summary",
    };
    let opts = ReportOptions::default();
    // What was live at the peak opens the report: one more walk, to the peak.
    let replay = ReplayOptions {
        categories: CategoryPass::IfLabelled,
        live_at_peak: true,
        ..ReplayOptions::default()
    };
    let inputs = r.inputs(&input.traces)?;
    let Loaded {
        traces, profiles, ..
    } = r.load_inputs(&inputs, replay)?;
    let ooms = profiles
        .iter()
        .any(|p| p.sources.iter().any(|s| s.pool.out_of_memory > 0))
        .then(|| poolsight::analyzer::tables::oom::section(&traces).0);
    let v: Vec<(String, Report)> = views(profiles, input.per_rank)
        .into_iter()
        .map(|v| (v.heading, Report::compute(&v.profile, &opts)))
        .collect();
    emit(
        out,
        input.format,
        &v,
        |rep| rep.render_table(&opts),
        |rep| rep.render_csv(table).unwrap_or_default(),
    )?;
    // Why it ran out of memory, after the tables, when a file holds an out-of-memory.
    if let (Format::Table, Some(ooms)) = (input.format, ooms) {
        let text = poolsight::analyzer::tables::oom::render_table(
            &ooms,
            super::oom::device_namer(&traces),
        );
        write!(out, "\n{text}")?;
    }
    Ok(())
}
