//! The report tables, each computed from a [`Profile`] and printed as its seed prints it:
//! [`summary`] (the headline), [`functions`] (Chainer's `CupyMemoryProfileHook`), [`lines`]
//! (CuPy's `LineProfileHook`), [`timers`] (Chainer's link and function `TimerHook`), [`epochs`]
//! (fastai's `PeakMemMetric`), [`categories`] (PyTorch's `MemTracker`: bytes by memory category
//! and by module); [`info`], what a file holds, is computed from the file itself and is not in
//! the list (see its documentation).
//!
//! Each is one file implementing [`Table`]: how it is computed, printed (table and CSV; JSON is
//! its `Serialize`), compared by `diff` ([`Table::FIGURES`]), written to the Parquet dataset
//! and shown in the HTML report. **The list of tables** below is the one place that names them
//! all: `report` prints them in its order, `diff` compares their figures, the HTML report and
//! the Parquet dataset take theirs from it. A new table is its file plus one line in that list
//! (plus its CLI command, golden files and documentation).

pub mod categories;
pub mod columns;
pub mod csv;
pub mod epochs;
mod figures;
pub mod functions;
pub mod info;
pub mod lines;
pub mod oom;
pub mod peak;
pub mod render;
pub mod summary;
pub mod timers;
pub mod whatif_figures;

use std::marker::PhantomData;

use serde::Serialize;

pub use columns::{Cell, Columns, HtmlColumn, HtmlTable};
pub use figures::{diff_keys, DiffKey, Figure, Figures, Keys, Quantity, Section};

use crate::replay::Profile;
use functions::Unit;
use timers::{TimeUnit, Which};

/// How each table is computed and printed (the CLI's options).
#[derive(Debug, Clone, Copy, Default)]
pub struct ReportOptions {
    /// `functions --unit`.
    pub unit: Unit,
    /// `functions --self`.
    pub with_self: bool,
    /// `lines --max-depth`.
    pub max_depth: usize,
    /// `timers --links/--functions`.
    pub timers: Which,
    /// `timers --unit`.
    pub time_unit: TimeUnit,
}

/// A report table. Implemented by each table's result type; see the module documentation.
pub trait Table: Serialize + Send + Sized {
    /// Its name: its CLI command, its key in `report`'s JSON, `report --table` in CSV, its
    /// table in the Parquet dataset.
    const NAME: &'static str;
    /// Its section in `diff`'s output.
    const SECTION: &'static str = Self::NAME;
    /// The keys it gives `diff`.
    const FIGURES: &'static [DiffKey];

    fn compute(p: &Profile, opts: &ReportOptions) -> Self;
    /// As its seed prints it.
    fn render_table(&self, opts: &ReportOptions) -> String;
    /// One CSV table.
    fn render_csv(&self) -> String;
    /// Its figures for `diff`, under the keys of [`Table::FIGURES`].
    fn figures(&self, out: &mut Figures);
    /// Its rows in the Parquet dataset; `None`: no table of its own there.
    fn columns(&self) -> Option<Columns> {
        None
    }
    /// Its sortable tables in the HTML report.
    fn html(&self) -> Vec<HtmlTable> {
        Vec::new()
    }
}

/// A computed table, whichever it is (what [`Report::tables`] hands out).
pub trait AnyTable: Sync {
    fn name(&self) -> &'static str;
    fn render_table(&self, opts: &ReportOptions) -> String;
    fn render_csv(&self) -> String;
    fn figures(&self, out: &mut Figures);
    fn columns(&self) -> Option<Columns>;
    fn html(&self) -> Vec<HtmlTable>;
}

impl<T: Table + Sync> AnyTable for T {
    fn name(&self) -> &'static str {
        T::NAME
    }
    fn render_table(&self, opts: &ReportOptions) -> String {
        Table::render_table(self, opts)
    }
    fn render_csv(&self) -> String {
        Table::render_csv(self)
    }
    fn figures(&self, out: &mut Figures) {
        Table::figures(self, out)
    }
    fn columns(&self) -> Option<Columns> {
        Table::columns(self)
    }
    fn html(&self) -> Vec<HtmlTable> {
        Table::html(self)
    }
}

/// What is known of a table without computing it.
trait TableKind {
    fn name(&self) -> &'static str;
    fn section(&self) -> Section;
    fn diff_keys(&self) -> Vec<(Section, DiffKey)>;
}

struct Kind<T>(PhantomData<T>);

impl<T: Table> TableKind for Kind<T> {
    fn name(&self) -> &'static str {
        T::NAME
    }
    fn section(&self) -> Section {
        Section(T::SECTION)
    }
    fn diff_keys(&self) -> Vec<(Section, DiffKey)> {
        T::FIGURES
            .iter()
            .map(|k| (Section(T::SECTION), *k))
            .collect()
    }
}

macro_rules! report_tables {
    ($($(#[$attr:meta])* $field:ident: $ty:ty),* $(,)?) => {
        /// Every table of one profile: what `report` prints (in this order), `diff` compares,
        /// the HTML report shows and the Parquet dataset holds.
        #[derive(Debug, Clone, PartialEq, Eq, Serialize)]
        pub struct Report {
            $($(#[$attr])* pub $field: $ty,)*
        }

        impl Report {
            /// Computes every table; they are independent, so rayon runs them side by side.
            pub fn compute(p: &Profile, opts: &ReportOptions) -> Report {
                $(let mut $field: Option<$ty> = None;)*
                rayon::scope(|s| {
                    $(
                        let slot = &mut $field;
                        s.spawn(move |_| *slot = Some(<$ty as Table>::compute(p, opts)));
                    )*
                });
                Report {
                    $($field: $field.expect("rayon::scope ran every task"),)*
                }
            }

            /// The tables, in the list's order.
            pub fn tables(&self) -> Vec<&dyn AnyTable> {
                vec![$(&self.$field as &dyn AnyTable,)*]
            }
        }

        /// `f` of every table of the list, in order.
        fn each_table<R>(f: impl Fn(&dyn TableKind) -> R) -> Vec<R> {
            vec![$(f(&Kind::<$ty>(PhantomData)),)*]
        }
    };
}

// The list of tables. A table that has nothing to show for a trace (categories of a trace
// without labels) prints nothing in `report` and is left out of its JSON.
report_tables! {
    summary: summary::Summary,
    #[serde(skip_serializing_if = "peak::Peak::is_empty")]
    peak: peak::Peak,
    functions: functions::Functions,
    lines: lines::Lines,
    timers: timers::Timers,
    epochs: epochs::Epochs,
    #[serde(skip_serializing_if = "categories::Categories::is_empty")]
    categories: categories::Categories,
}

/// The tables' names, in the list's order (`report --table` takes one).
pub fn names() -> Vec<&'static str> {
    each_table(|t| t.name())
}

impl Report {
    /// Every table as its seed prints it, the headline first (a table with nothing to show
    /// prints nothing, not even its blank line).
    pub fn render_table(&self, opts: &ReportOptions) -> String {
        self.tables()
            .iter()
            .map(|t| t.render_table(opts))
            .filter(|t| !t.is_empty())
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// The table `name` as CSV (a CSV file holds one table, so that pandas, DuckDB or a
    /// spreadsheet load it as it is); `None` for a name not in the list.
    pub fn render_csv(&self, name: &str) -> Option<String> {
        self.tables()
            .into_iter()
            .find(|t| t.name() == name)
            .map(|t| t.render_csv())
    }
}
