//! The one CSV writer of the reports: a header row of the row struct's field names, then one
//! line per row, each cell the field's value, all driven by the row's `serde::Serialize`.
//!
//! RFC 4180 quoting: a cell is quoted only when it holds a comma, a quote or a line break,
//! quotes doubled inside; lines end with `\n`. `None` is an empty cell, booleans are
//! `true`/`false`. The header is written even when there are no rows (taken from the row
//! type's `Default`), so an empty report still says what its columns are. Rows must be flat
//! structs of scalars; the report modules' tests cover every row type.

use std::fmt::{self, Display};

use serde::ser::{self, Impossible, Serialize, SerializeStruct, Serializer};

/// The rows as CSV, header first.
pub fn to_csv<R: Serialize + Default>(rows: &[R]) -> String {
    let mut out = String::new();
    let header = match rows.first() {
        Some(r) => cells(r),
        None => cells(&R::default()),
    };
    push_line(&mut out, &header.names);
    for r in rows {
        push_line(&mut out, &cells(r).values);
    }
    out
}

fn cells<R: Serialize>(row: &R) -> Row {
    let mut cells = Row::default();
    if let Err(e) = row.serialize(&mut cells) {
        // A row type that is not a flat struct of scalars: a bug in this crate, not data.
        panic!("CSV rows must be flat structs of scalars: {e}");
    }
    cells
}

fn push_line(out: &mut String, cells: &[String]) {
    for (i, c) in cells.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(&cell(c));
    }
    out.push('\n');
}

/// A CSV cell: quoted when it holds a comma, a quote or a line break (RFC 4180).
pub fn cell(text: &str) -> std::borrow::Cow<'_, str> {
    if text.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", text.replace('"', "\"\"")).into()
    } else {
        text.into()
    }
}

/// A value that has no CSV cell (a nested struct, a sequence, a map).
#[derive(Debug)]
pub struct Unsupported(String);

impl Display for Unsupported {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Unsupported {}

impl ser::Error for Unsupported {
    fn custom<T: Display>(msg: T) -> Self {
        Unsupported(msg.to_string())
    }
}

fn unsupported<T>(what: &str) -> Result<T, Unsupported> {
    Err(Unsupported(format!("{what} has no CSV cell")))
}

/// One row's field names and cell texts.
#[derive(Default)]
struct Row {
    names: Vec<String>,
    values: Vec<String>,
}

/// Serializer methods a row or a cell does not support.
macro_rules! refuse {
    ($($method:ident($($arg:ty),*) -> $ret:ty;)*) => {
        $(fn $method(self, $(_: $arg),*) -> Result<$ret, Unsupported> {
            unsupported(stringify!($method))
        })*
    };
}

/// The compound values neither a row nor a cell can be.
macro_rules! refuse_compound {
    () => {
        refuse! {
            serialize_seq(Option<usize>) -> Self::SerializeSeq;
            serialize_tuple(usize) -> Self::SerializeTuple;
            serialize_tuple_struct(&'static str, usize) -> Self::SerializeTupleStruct;
            serialize_tuple_variant(&'static str, u32, &'static str, usize) -> Self::SerializeTupleVariant;
            serialize_map(Option<usize>) -> Self::SerializeMap;
            serialize_struct_variant(&'static str, u32, &'static str, usize) -> Self::SerializeStructVariant;
        }
    };
}

impl Serializer for &mut Row {
    type Ok = ();
    type Error = Unsupported;
    type SerializeSeq = Impossible<(), Unsupported>;
    type SerializeTuple = Impossible<(), Unsupported>;
    type SerializeTupleStruct = Impossible<(), Unsupported>;
    type SerializeTupleVariant = Impossible<(), Unsupported>;
    type SerializeMap = Impossible<(), Unsupported>;
    type SerializeStruct = Self;
    type SerializeStructVariant = Impossible<(), Unsupported>;

    fn serialize_struct(self, _: &'static str, _: usize) -> Result<Self, Unsupported> {
        Ok(self)
    }

    fn serialize_some<T: ?Sized + Serialize>(self, _: &T) -> Result<(), Unsupported> {
        unsupported("an optional row")
    }

    fn serialize_newtype_struct<T: ?Sized + Serialize>(
        self,
        _: &'static str,
        _: &T,
    ) -> Result<(), Unsupported> {
        unsupported("a newtype row")
    }

    fn serialize_newtype_variant<T: ?Sized + Serialize>(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: &T,
    ) -> Result<(), Unsupported> {
        unsupported("an enum row")
    }

    refuse! {
        serialize_bool(bool) -> ();
        serialize_i8(i8) -> ();
        serialize_i16(i16) -> ();
        serialize_i32(i32) -> ();
        serialize_i64(i64) -> ();
        serialize_u8(u8) -> ();
        serialize_u16(u16) -> ();
        serialize_u32(u32) -> ();
        serialize_u64(u64) -> ();
        serialize_f32(f32) -> ();
        serialize_f64(f64) -> ();
        serialize_char(char) -> ();
        serialize_str(&str) -> ();
        serialize_bytes(&[u8]) -> ();
        serialize_none() -> ();
        serialize_unit() -> ();
        serialize_unit_struct(&'static str) -> ();
        serialize_unit_variant(&'static str, u32, &'static str) -> ();
    }
    refuse_compound!();
}

impl SerializeStruct for &mut Row {
    type Ok = ();
    type Error = Unsupported;

    fn serialize_field<T: ?Sized + Serialize>(
        &mut self,
        key: &'static str,
        value: &T,
    ) -> Result<(), Unsupported> {
        self.names.push(key.to_owned());
        self.values.push(value.serialize(Cell)?);
        Ok(())
    }

    fn end(self) -> Result<(), Unsupported> {
        Ok(())
    }
}

/// One scalar's text.
struct Cell;

impl Serializer for Cell {
    type Ok = String;
    type Error = Unsupported;
    type SerializeSeq = Impossible<String, Unsupported>;
    type SerializeTuple = Impossible<String, Unsupported>;
    type SerializeTupleStruct = Impossible<String, Unsupported>;
    type SerializeTupleVariant = Impossible<String, Unsupported>;
    type SerializeMap = Impossible<String, Unsupported>;
    type SerializeStruct = Impossible<String, Unsupported>;
    type SerializeStructVariant = Impossible<String, Unsupported>;

    fn serialize_bool(self, v: bool) -> Result<String, Unsupported> {
        Ok(v.to_string())
    }
    fn serialize_i8(self, v: i8) -> Result<String, Unsupported> {
        Ok(v.to_string())
    }
    fn serialize_i16(self, v: i16) -> Result<String, Unsupported> {
        Ok(v.to_string())
    }
    fn serialize_i32(self, v: i32) -> Result<String, Unsupported> {
        Ok(v.to_string())
    }
    fn serialize_i64(self, v: i64) -> Result<String, Unsupported> {
        Ok(v.to_string())
    }
    fn serialize_u8(self, v: u8) -> Result<String, Unsupported> {
        Ok(v.to_string())
    }
    fn serialize_u16(self, v: u16) -> Result<String, Unsupported> {
        Ok(v.to_string())
    }
    fn serialize_u32(self, v: u32) -> Result<String, Unsupported> {
        Ok(v.to_string())
    }
    fn serialize_u64(self, v: u64) -> Result<String, Unsupported> {
        Ok(v.to_string())
    }
    fn serialize_f32(self, v: f32) -> Result<String, Unsupported> {
        Ok(v.to_string())
    }
    fn serialize_f64(self, v: f64) -> Result<String, Unsupported> {
        Ok(v.to_string())
    }
    fn serialize_char(self, v: char) -> Result<String, Unsupported> {
        Ok(v.to_string())
    }
    fn serialize_str(self, v: &str) -> Result<String, Unsupported> {
        Ok(v.to_owned())
    }
    fn serialize_none(self) -> Result<String, Unsupported> {
        Ok(String::new())
    }
    fn serialize_some<T: ?Sized + Serialize>(self, v: &T) -> Result<String, Unsupported> {
        v.serialize(self)
    }
    fn serialize_unit(self) -> Result<String, Unsupported> {
        Ok(String::new())
    }
    fn serialize_unit_struct(self, _: &'static str) -> Result<String, Unsupported> {
        Ok(String::new())
    }
    fn serialize_unit_variant(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
    ) -> Result<String, Unsupported> {
        Ok(variant.to_owned())
    }
    fn serialize_newtype_struct<T: ?Sized + Serialize>(
        self,
        _: &'static str,
        v: &T,
    ) -> Result<String, Unsupported> {
        v.serialize(self)
    }
    fn serialize_newtype_variant<T: ?Sized + Serialize>(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: &T,
    ) -> Result<String, Unsupported> {
        unsupported("an enum with data")
    }

    refuse! {
        serialize_bytes(&[u8]) -> String;
        serialize_struct(&'static str, usize) -> Self::SerializeStruct;
    }
    refuse_compound!();
}

#[cfg(test)]
mod tests {
    use serde::Serialize;

    use super::*;

    #[derive(Default, Serialize)]
    struct R {
        name: String,
        n: u64,
        line: Option<u32>,
        ok: bool,
    }

    #[test]
    fn quoting_header_and_empty() {
        let rows = [R {
            name: "say \"hi\", twice".into(),
            n: 3,
            line: None,
            ok: true,
        }];
        assert_eq!(
            to_csv(&rows),
            "name,n,line,ok\n\"say \"\"hi\"\", twice\",3,,true\n"
        );
        assert_eq!(to_csv::<R>(&[]), "name,n,line,ok\n");
    }
}
