//! A small Python-object model ([`Value`]) with a hand-written pickle writer
//! (protocol 2, readable by every Python 3) and a JSON rendering.
//!
//! Only what snapshots need: `None`, `bool`, `int` (any size), `float`,
//! `str`, `list`, `tuple` and `dict`. The writer emits no memo entries, so
//! shared sub-objects are written twice (snapshots have none).

use std::fmt::Write as _;

/// A Python value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// `None`.
    None,
    /// `True` / `False`.
    Bool(bool),
    /// An `int` (pickled as a 32-bit int when it fits, else as a long).
    Int(i128),
    /// A `float`.
    Float(f64),
    /// A `str`.
    Str(String),
    /// A `list`.
    List(Vec<Value>),
    /// A `tuple`.
    Tuple(Vec<Value>),
    /// A `dict`, in insertion order.
    Dict(Vec<(Value, Value)>),
}

impl From<bool> for Value {
    fn from(v: bool) -> Self {
        Value::Bool(v)
    }
}
impl From<u64> for Value {
    fn from(v: u64) -> Self {
        Value::Int(v.into())
    }
}
impl From<i64> for Value {
    fn from(v: i64) -> Self {
        Value::Int(v.into())
    }
}
impl From<u32> for Value {
    fn from(v: u32) -> Self {
        Value::Int(v.into())
    }
}
impl From<f64> for Value {
    fn from(v: f64) -> Self {
        Value::Float(v)
    }
}
impl From<&str> for Value {
    fn from(v: &str) -> Self {
        Value::Str(v.to_owned())
    }
}
impl From<String> for Value {
    fn from(v: String) -> Self {
        Value::Str(v)
    }
}
impl<T: Into<Value>> From<Option<T>> for Value {
    fn from(v: Option<T>) -> Self {
        v.map_or(Value::None, Into::into)
    }
}
impl From<Vec<Value>> for Value {
    fn from(v: Vec<Value>) -> Self {
        Value::List(v)
    }
}

/// Builds a [`Value::Dict`] with string keys.
pub fn dict<K: Into<String>>(items: impl IntoIterator<Item = (K, Value)>) -> Value {
    Value::Dict(
        items
            .into_iter()
            .map(|(k, v)| (Value::Str(k.into()), v))
            .collect(),
    )
}

// Pickle opcodes (protocol 2).
const PROTO: u8 = 0x80;
const STOP: u8 = b'.';
const NONE: u8 = b'N';
const NEWTRUE: u8 = 0x88;
const NEWFALSE: u8 = 0x89;
const BININT: u8 = b'J';
const BININT1: u8 = b'K';
const BININT2: u8 = b'M';
const LONG1: u8 = 0x8a;
const LONG4: u8 = 0x8b;
const BINFLOAT: u8 = b'G';
const BINUNICODE: u8 = b'X';
const EMPTY_LIST: u8 = b']';
const APPENDS: u8 = b'e';
const EMPTY_TUPLE: u8 = b')';
const TUPLE1: u8 = 0x85;
const TUPLE2: u8 = 0x86;
const TUPLE3: u8 = 0x87;
const TUPLE: u8 = b't';
const EMPTY_DICT: u8 = b'}';
const SETITEMS: u8 = b'u';
const MARK: u8 = b'(';

/// Items per APPENDS / SETITEMS batch (as CPython's pickler).
const BATCH: usize = 1000;

impl Value {
    /// The value pickled with protocol 2 (`pickle.loads` reads it).
    pub fn to_pickle(&self) -> Vec<u8> {
        let mut out = vec![PROTO, 2];
        self.write_pickle(&mut out);
        out.push(STOP);
        out
    }

    fn write_pickle(&self, out: &mut Vec<u8>) {
        match self {
            Value::None => out.push(NONE),
            Value::Bool(true) => out.push(NEWTRUE),
            Value::Bool(false) => out.push(NEWFALSE),
            Value::Int(i) => write_int(*i, out),
            Value::Float(f) => {
                out.push(BINFLOAT);
                out.extend_from_slice(&f.to_be_bytes());
            }
            Value::Str(s) => {
                out.push(BINUNICODE);
                // Strings longer than 4 GiB cannot occur in snapshots; clamp
                // defensively instead of panicking.
                let bytes = s.as_bytes();
                let len = u32::try_from(bytes.len()).unwrap_or(u32::MAX);
                out.extend_from_slice(&len.to_le_bytes());
                out.extend_from_slice(&bytes[..len as usize]);
            }
            Value::List(items) => {
                out.push(EMPTY_LIST);
                for chunk in items.chunks(BATCH) {
                    out.push(MARK);
                    for v in chunk {
                        v.write_pickle(out);
                    }
                    out.push(APPENDS);
                }
            }
            Value::Tuple(items) => match items.len() {
                0 => out.push(EMPTY_TUPLE),
                n @ 1..=3 => {
                    for v in items {
                        v.write_pickle(out);
                    }
                    out.push([TUPLE1, TUPLE2, TUPLE3][n - 1]);
                }
                _ => {
                    out.push(MARK);
                    for v in items {
                        v.write_pickle(out);
                    }
                    out.push(TUPLE);
                }
            },
            Value::Dict(items) => {
                out.push(EMPTY_DICT);
                for chunk in items.chunks(BATCH) {
                    out.push(MARK);
                    for (k, v) in chunk {
                        k.write_pickle(out);
                        v.write_pickle(out);
                    }
                    out.push(SETITEMS);
                }
            }
        }
    }

    /// The value as JSON text (tuples become arrays, dict keys strings,
    /// non-finite floats `null`).
    pub fn to_json(&self) -> String {
        let mut s = String::new();
        self.write_json(&mut s);
        s
    }

    /// The value as a [`serde_json::Value`].
    pub fn to_json_value(&self) -> serde_json::Value {
        use serde_json::Value as J;
        match self {
            Value::None => J::Null,
            Value::Bool(b) => J::Bool(*b),
            Value::Int(i) => {
                if let Ok(v) = i64::try_from(*i) {
                    J::from(v)
                } else if let Ok(v) = u64::try_from(*i) {
                    J::from(v)
                } else {
                    J::String(i.to_string())
                }
            }
            Value::Float(f) => serde_json::Number::from_f64(*f).map_or(J::Null, J::Number),
            Value::Str(s) => J::String(s.clone()),
            Value::List(v) | Value::Tuple(v) => {
                J::Array(v.iter().map(Value::to_json_value).collect())
            }
            Value::Dict(items) => J::Object(
                items
                    .iter()
                    .map(|(k, v)| (k.key_string(), v.to_json_value()))
                    .collect(),
            ),
        }
    }

    fn key_string(&self) -> String {
        match self {
            Value::Str(s) => s.clone(),
            other => other.to_json(),
        }
    }

    fn write_json(&self, out: &mut String) {
        match self {
            Value::None => out.push_str("null"),
            Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Value::Int(i) => {
                let _ = write!(out, "{i}");
            }
            Value::Float(f) => {
                if f.is_finite() {
                    let n = serde_json::Number::from_f64(*f);
                    match n {
                        Some(n) => out.push_str(&n.to_string()),
                        None => out.push_str("null"),
                    }
                } else {
                    out.push_str("null");
                }
            }
            Value::Str(s) => out.push_str(&serde_json::Value::String(s.clone()).to_string()),
            Value::List(v) | Value::Tuple(v) => {
                out.push('[');
                for (i, x) in v.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    x.write_json(out);
                }
                out.push(']');
            }
            Value::Dict(items) => {
                out.push('{');
                for (i, (k, v)) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(&serde_json::Value::String(k.key_string()).to_string());
                    out.push(':');
                    v.write_json(out);
                }
                out.push('}');
            }
        }
    }
}

fn write_int(i: i128, out: &mut Vec<u8>) {
    if (0..=0xff).contains(&i) {
        out.push(BININT1);
        out.push(i as u8);
    } else if (0..=0xffff).contains(&i) {
        out.push(BININT2);
        out.extend_from_slice(&(i as u16).to_le_bytes());
    } else if let Ok(v) = i32::try_from(i) {
        out.push(BININT);
        out.extend_from_slice(&v.to_le_bytes());
    } else {
        // Minimal little-endian two's complement, as `encode_long`.
        let bytes = i.to_le_bytes();
        let mut n = bytes.len();
        while n > 1 {
            let last = bytes[n - 1];
            let prev_sign = bytes[n - 2] & 0x80;
            if (last == 0 && prev_sign == 0) || (last == 0xff && prev_sign != 0) {
                n -= 1;
            } else {
                break;
            }
        }
        if n < 256 {
            out.push(LONG1);
            out.push(n as u8);
        } else {
            out.push(LONG4);
            out.extend_from_slice(&(n as u32).to_le_bytes());
        }
        out.extend_from_slice(&bytes[..n]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_values_match_cpython_bytes() {
        // python3 -c 'import pickle; print(pickle.dumps(X, 2))'
        assert_eq!(Value::None.to_pickle(), b"\x80\x02N.");
        assert_eq!(Value::Int(5).to_pickle(), b"\x80\x02K\x05.");
        assert_eq!(Value::Int(-1).to_pickle(), b"\x80\x02J\xff\xff\xff\xff.");
        assert_eq!(
            Value::Int(1 << 40).to_pickle(),
            b"\x80\x02\x8a\x06\x00\x00\x00\x00\x00\x01."
        );
        assert_eq!(
            Value::Int(u64::MAX.into()).to_pickle(),
            b"\x80\x02\x8a\x09\xff\xff\xff\xff\xff\xff\xff\xff\x00."
        );
        assert_eq!(
            Value::Int(-(1 << 40)).to_pickle(),
            b"\x80\x02\x8a\x06\x00\x00\x00\x00\x00\xff."
        );
        assert_eq!(
            Value::Int(128).to_pickle(),
            b"\x80\x02K\x80.",
            "BININT1 is unsigned"
        );
    }

    #[test]
    fn json_rendering() {
        let v = dict([
            ("a", Value::Tuple(vec![Value::Int(0), Value::Int(1)])),
            ("b", Value::Str("x\"y".into())),
            ("c", Value::Float(f64::NAN)),
            ("d", Value::None),
        ]);
        assert_eq!(v.to_json(), r#"{"a":[0,1],"b":"x\"y","c":null,"d":null}"#);
        let parsed: serde_json::Value = serde_json::from_str(&v.to_json()).unwrap();
        assert_eq!(parsed, v.to_json_value());
    }
}
