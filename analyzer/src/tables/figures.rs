//! One run's figures, as `diff` compares them: every table flattened into one number per stable
//! key (the keys are listed in the documentation of `diff`). Each table says which keys it
//! gives ([`super::Table::FIGURES`]) and fills them in ([`super::Table::figures`]).

use std::fmt;
use std::sync::{Arc, Mutex};

use rustc_hash::{FxHashMap, FxHashSet};
use serde::{Serialize, Serializer};

use super::Table;

/// What a figure counts; decides how it prints and which rule values fit it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Quantity {
    Bytes,
    Nanoseconds,
    Count,
}

impl Quantity {
    pub fn name(self) -> &'static str {
        match self {
            Quantity::Bytes => "a size in bytes",
            Quantity::Nanoseconds => "a duration",
            Quantity::Count => "a count",
        }
    }
}

/// A key a table gives `diff`: `scope:NAME.figure`, or with an empty scope a headline key
/// `figure` (with the `alias` a rule may use for it), or with an empty figure a named key
/// `scope.NAME` (`peak.category.activation`: the name last, since a line's name holds dots).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiffKey {
    pub scope: &'static str,
    pub figure: &'static str,
    pub alias: Option<&'static str>,
    pub quantity: Quantity,
}

impl DiffKey {
    /// `scope:NAME.figure`.
    pub const fn scoped(scope: &'static str, figure: &'static str, quantity: Quantity) -> DiffKey {
        DiffKey {
            scope,
            figure,
            alias: None,
            quantity,
        }
    }

    /// `scope.NAME`: one figure per name, the name last.
    pub const fn named(scope: &'static str, quantity: Quantity) -> DiffKey {
        DiffKey {
            scope,
            figure: "",
            alias: None,
            quantity,
        }
    }

    /// Whether the key is `scope.NAME` ([`DiffKey::named`]).
    pub fn is_named(&self) -> bool {
        self.figure.is_empty() && !self.scope.is_empty()
    }

    /// A headline key, `figure` (or `alias`).
    pub const fn headline(
        figure: &'static str,
        alias: Option<&'static str>,
        quantity: Quantity,
    ) -> DiffKey {
        DiffKey {
            scope: "",
            figure,
            alias,
            quantity,
        }
    }
}

/// The table a figure comes from (its section in `diff`'s output, named as the table's
/// [`Table::SECTION`]); sections print in the order of the list of tables.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Section(pub &'static str);

impl Section {
    /// The headline figures (the `summary` table's).
    pub const HEADLINE: Section = Section("headline");
    /// What was live at the peak (the `peak` table's figures).
    pub const PEAK: Section = Section("peak");

    /// Every section, in the order they print (a table that gives `diff` no figures, such as
    /// `peak`, has none).
    pub fn all() -> Vec<Section> {
        super::each_table(|t| (!t.diff_keys().is_empty()).then(|| t.section()))
            .into_iter()
            .flatten()
            .chain([super::whatif_figures::SECTION])
            .collect()
    }

    pub fn as_str(self) -> &'static str {
        self.0
    }

    /// Its place in [`Section::all`] (the list is made once: `diff` sorts hundreds of
    /// thousands of rows by it).
    fn rank(self) -> usize {
        static ALL: std::sync::OnceLock<Vec<Section>> = std::sync::OnceLock::new();
        ALL.get_or_init(Section::all)
            .iter()
            .position(|s| *s == self)
            .unwrap_or(usize::MAX)
    }
}

impl PartialOrd for Section {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Section {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.rank()
            .cmp(&other.rank())
            .then_with(|| self.0.cmp(other.0))
    }
}

impl fmt::Display for Section {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

impl Serialize for Section {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.0)
    }
}

/// One figure of one run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Figure {
    pub section: Section,
    pub quantity: Quantity,
    pub value: i64,
}

/// The keys of the runs a `diff` compares, each held once: the runs of two sides share
/// nearly all their keys, and a `lines` key is its node's whole path (hundreds of bytes, and
/// 750,000 keys in a 100 MB snapshot), so that a copy of them per run and one more for the
/// comparison's rows was most of `diff`'s memory.
#[derive(Debug, Clone, Default)]
pub struct Keys(Arc<Mutex<FxHashSet<Arc<str>>>>);

impl Keys {
    fn get(&self, key: String) -> Arc<str> {
        let mut keys = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(k) = keys.get(key.as_str()) {
            return k.clone();
        }
        let k: Arc<str> = Arc::from(key);
        keys.insert(k.clone());
        k
    }
}

/// Every figure of one run, by key.
#[derive(Debug, Clone, Default)]
pub struct Figures {
    /// Keys can be long (a `lines` key is its node's whole path): a fast hash, not SipHash.
    pub by_key: FxHashMap<Arc<str>, Figure>,
    /// The stack behind a key that names only its innermost line (a `peak.line` key): the
    /// largest of the stacks it sums, outermost frame first.
    pub stacks: FxHashMap<Arc<str>, Arc<str>>,
    /// Where its keys are held (shared with the other runs of a `diff`).
    keys: Keys,
}

impl PartialEq for Figures {
    fn eq(&self, other: &Figures) -> bool {
        self.by_key == other.by_key
    }
}

impl Eq for Figures {}

impl Figures {
    /// Flattens one run's report into keyed figures, table by table.
    pub fn of(r: &super::Report) -> Figures {
        Figures::sharing(r, &Keys::default())
    }

    /// [`Figures::of`], its keys held in `keys` with those of the other runs given them.
    pub fn sharing(r: &super::Report, keys: &Keys) -> Figures {
        let mut f = Figures::empty(keys);
        for t in r.tables() {
            t.figures(&mut f);
        }
        f
    }

    /// An empty set of figures whose keys are held in `keys`.
    pub fn empty(keys: &Keys) -> Figures {
        Figures {
            by_key: FxHashMap::default(),
            stacks: FxHashMap::default(),
            keys: keys.clone(),
        }
    }

    /// Adds `scope.name` of table `T`, which declares it ([`DiffKey::named`]), with the
    /// stack behind it when there is one.
    pub fn named<T: Table>(&mut self, scope: &str, name: &str, value: i64, stack: Option<&str>) {
        if let Some(k) = T::FIGURES.iter().find(|k| k.is_named() && k.scope == scope) {
            let key = self.keys.get(format!("{scope}.{name}"));
            if let Some(stack) = stack {
                self.stacks.insert(key.clone(), Arc::from(stack));
            }
            self.by_key.entry(key).or_insert(Figure {
                section: Section(T::SECTION),
                quantity: k.quantity,
                value,
            });
        }
    }

    /// Adds a figure under `key` (the first one given for a key stays).
    pub fn put(&mut self, key: String, section: Section, quantity: Quantity, value: i64) {
        self.by_key.entry(self.keys.get(key)).or_insert(Figure {
            section,
            quantity,
            value,
        });
    }

    /// Adds `scope:name.figure` of table `T`, which declares it in [`Table::FIGURES`].
    pub fn scoped<T: Table>(&mut self, scope: &str, name: &str, figure: &str, value: i64) {
        if let Some(k) = T::FIGURES
            .iter()
            .find(|k| k.scope == scope && k.figure == figure)
        {
            self.put(
                format!("{scope}:{name}.{figure}"),
                Section(T::SECTION),
                k.quantity,
                value,
            );
        }
    }

    /// Adds the headline figure `figure` of table `T`.
    pub fn headline<T: Table>(&mut self, figure: &str, value: i64) {
        if let Some(k) = T::FIGURES
            .iter()
            .find(|k| k.scope.is_empty() && k.figure == figure)
        {
            self.put(figure.to_string(), Section(T::SECTION), k.quantity, value);
        }
    }
}

/// Every key the tables give `diff`, with its section: what a rule may name.
pub fn diff_keys() -> Vec<(Section, DiffKey)> {
    super::each_table(|t| t.diff_keys())
        .into_iter()
        .flatten()
        .chain(
            super::whatif_figures::DIFF_KEYS
                .iter()
                .map(|k| (super::whatif_figures::SECTION, *k)),
        )
        .collect()
}
