//! A small Python-object model ([`Value`]), pickled by `serde-pickle` and
//! rendered as JSON by `serde_json`.
//!
//! Only what snapshots need: `None`, `bool`, `int`, `float`, `str`,
//! `list`, `tuple` and `dict` (insertion order kept). [`Value`] implements
//! [`serde::Serialize`]; [`Value::to_pickle`] writes it with
//! `serde_pickle::to_vec` (protocol 2, as before, which `pickle.load` of
//! every Python 3, hence `torch.cuda._memory_viz`, reads).
//!
//! This replaced a hand-written protocol-2 writer. Measured on the
//! snapshot of `traces/gpt2_train.trace` (`cachalot replay --passes 1
//! --snapshot gpt2.pickle`, release build, best of 25 runs): recording the
//! history and writing the pickle add 16 ms to the replay's 17 ms with
//! either writer (32.5 ms in all with serde-pickle, 33.6 ms with the old
//! writer), and the file is 2,406,236 bytes instead of 2,306,160 (+4%:
//! serde-pickle writes every integer under 2^31 as a 4-byte `BININT`
//! where the old writer used 1 or 2 bytes when it could). Nothing argued
//! for keeping hand-written code, and both load to equal Python objects
//! (PyTorch 2.11's own `torch/cuda/_memory_viz.py` renders the new one:
//! `scripts/check_memory_viz.py --viz-module`). One
//! difference: `serde` has no integer wider than 64 bits for `serde-pickle`
//! to write, so an [`Value::Int`] outside the `i64` and `u64` ranges is an
//! error ([`PickleError`]) instead of a Python long; snapshots hold
//! addresses, sizes and counts, all 64-bit.

/// A Python value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// `None`.
    None,
    /// `True` / `False`.
    Bool(bool),
    /// An `int` (pickled when within the `i64` or `u64` range).
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

/// A [`Value`] as JSON sees it: every dict key a string, integers wider
/// than 64 bits strings (so serializing it cannot fail).
struct Json<'a>(&'a Value);

impl serde::Serialize for Json<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::{SerializeMap, SerializeSeq};
        match self.0 {
            Value::Int(i) if i64::try_from(*i).is_err() && u64::try_from(*i).is_err() => {
                s.serialize_str(&i.to_string())
            }
            Value::List(items) | Value::Tuple(items) => {
                let mut seq = s.serialize_seq(Some(items.len()))?;
                for v in items {
                    seq.serialize_element(&Json(v))?;
                }
                seq.end()
            }
            Value::Dict(items) => {
                let mut m = s.serialize_map(Some(items.len()))?;
                for (k, v) in items {
                    m.serialize_entry(&k.key_string(), &Json(v))?;
                }
                m.end()
            }
            other => serde::Serialize::serialize(other, s),
        }
    }
}

/// Why a [`Value`] could not be pickled (an integer wider than 64 bits).
pub type PickleError = serde_pickle::Error;

impl serde::Serialize for Value {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::{Error as _, SerializeMap, SerializeSeq, SerializeTuple};
        match self {
            Value::None => s.serialize_none(),
            Value::Bool(b) => s.serialize_bool(*b),
            Value::Int(i) => {
                if let Ok(v) = i64::try_from(*i) {
                    s.serialize_i64(v)
                } else if let Ok(v) = u64::try_from(*i) {
                    s.serialize_u64(v)
                } else {
                    Err(S::Error::custom(format!(
                        "the integer {i} is outside the 64-bit ranges"
                    )))
                }
            }
            Value::Float(f) => s.serialize_f64(*f),
            Value::Str(v) => s.serialize_str(v),
            Value::List(items) => {
                let mut seq = s.serialize_seq(Some(items.len()))?;
                for v in items {
                    seq.serialize_element(v)?;
                }
                seq.end()
            }
            Value::Tuple(items) => {
                let mut t = s.serialize_tuple(items.len())?;
                for v in items {
                    t.serialize_element(v)?;
                }
                t.end()
            }
            Value::Dict(items) => {
                let mut m = s.serialize_map(Some(items.len()))?;
                for (k, v) in items {
                    m.serialize_entry(k, v)?;
                }
                m.end()
            }
        }
    }
}

impl Value {
    /// The value as a pickle (`pickle.loads` reads it). Errors only for an
    /// integer outside the 64-bit ranges.
    pub fn to_pickle(&self) -> Result<Vec<u8>, PickleError> {
        serde_pickle::to_vec(self, serde_pickle::SerOptions::new().proto_v2())
    }

    /// The value as JSON text, dicts in insertion order (tuples become
    /// arrays, dict keys strings, integers wider than 64 bits strings,
    /// non-finite floats `null`).
    pub fn to_json(&self) -> String {
        serde_json::to_string(&Json(self)).unwrap_or_else(|_| self.to_json_value().to_string())
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
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bytes serde-pickle writes decode to the same values (read back
    /// with its own reader; CPython reads them in `tests/pickle_python.rs`).
    #[test]
    fn values_round_trip_through_serde_pickle() {
        use serde_pickle::Value as P;
        let opts = serde_pickle::DeOptions::default;
        let v = dict([
            ("n", Value::None),
            ("t", Value::Tuple(vec![Value::Int(0), Value::from("x")])),
            ("f", Value::Float(-1.5)),
        ]);
        let d: std::collections::BTreeMap<String, P> =
            serde_pickle::from_slice(&v.to_pickle().unwrap(), opts()).unwrap();
        assert_eq!(d["n"], P::None);
        // serde-pickle's reader turns tuples into lists; CPython reads a
        // tuple (`tests/pickle_python.rs` checks its type)
        assert_eq!(d["t"], P::List(vec![P::I64(0), P::String("x".into())]));
        assert_eq!(d["f"], P::F64(-1.5));
        let ints = Value::List(vec![
            Value::Int(5),
            Value::Int(-1),
            Value::Int(i64::MIN.into()),
            Value::Int(u64::MAX.into()),
        ]);
        let back: P = serde_pickle::value_from_slice(&ints.to_pickle().unwrap(), opts()).unwrap();
        // (u64::MAX is a Python long: serde-pickle's BigInt)
        assert_eq!(
            format!("{back:?}"),
            format!(
                "List([I64(5), I64(-1), I64({}), Int({})])",
                i64::MIN,
                u64::MAX
            )
        );
    }

    #[test]
    fn integers_wider_than_64_bits_are_an_error() {
        let e = Value::List(vec![Value::Int(1 << 100)])
            .to_pickle()
            .unwrap_err();
        assert!(e.to_string().contains("64-bit"), "{e}");
        assert!(Value::Int(i64::MIN.into()).to_pickle().is_ok());
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
        // insertion order, non-string keys and wide integers
        let w = Value::Dict(vec![
            (Value::from("z"), Value::Int(1 << 100)),
            (Value::Int(7), Value::Tuple(vec![])),
            (Value::Tuple(vec![Value::Int(1)]), Value::Bool(true)),
        ]);
        assert_eq!(
            w.to_json(),
            format!(r#"{{"z":"{}","7":[],"[1]":true}}"#, 1i128 << 100)
        );
        let parsed: serde_json::Value = serde_json::from_str(&v.to_json()).unwrap();
        assert_eq!(parsed, v.to_json_value());
    }
}
