//! Deserializes a `serde_json::Value` with `serde` and reports where an error happened: the
//! path of object keys and array indexes the deserializer was at (`routes[1].tokenizer.cluster`).
//!
//! A concrete deserializer over the parsed value: it steps into objects and arrays itself and
//! leaves every scalar to `serde_json`'s own `Value` deserializer. (The `serde_path_to_error`
//! crate does the same for any deserializer; its generic wrappers cost 23 KB of the filter's
//! wasm module, over 8 % of it.)

use serde::de::{
    self, DeserializeSeed, Deserializer, IntoDeserializer, MapAccess, SeqAccess, Visitor,
};
use serde::Deserialize;
use serde_json::{Map, Value};

/// One step of a path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Segment {
    Key(String),
    Index(usize),
}

/// A deserialization error and where it happened (empty: at the root).
#[derive(Debug)]
pub struct PathError {
    pub path: Vec<Segment>,
    pub error: serde_json::Error,
}

/// `T` from `value`, or the error with its path.
pub fn deserialize<T: for<'de> Deserialize<'de>>(value: Value) -> Result<T, PathError> {
    let mut path = Vec::new();
    T::deserialize(At {
        value,
        path: &mut path,
    })
    .map_err(|error| PathError { path, error })
}

/// A value and the path to it. Steps are pushed before a key or value is read and popped once
/// it was read, so on an error the path ends where the error happened.
struct At<'p> {
    value: Value,
    path: &'p mut Vec<Segment>,
}

impl<'de> Deserializer<'de> for At<'_> {
    type Error = serde_json::Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        match self.value {
            Value::Object(map) => visitor.visit_map(Members {
                iter: map.into_iter(),
                value: None,
                path: self.path,
            }),
            Value::Array(items) => visitor.visit_seq(Items {
                iter: items.into_iter().enumerate(),
                path: self.path,
            }),
            scalar => scalar.deserialize_any(visitor),
        }
    }

    // A struct or a map is read only from an object, a sequence only from an array: the
    // other branches of `deserialize_any` are not instantiated for their visitors.
    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        _: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        self.deserialize_map(visitor)
    }

    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        match self.value {
            Value::Object(map) => visitor.visit_map(Members {
                iter: map.into_iter(),
                value: None,
                path: self.path,
            }),
            _ => Err(de::Error::custom("must be an object")),
        }
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        match self.value {
            Value::Array(items) => visitor.visit_seq(Items {
                iter: items.into_iter().enumerate(),
                path: self.path,
            }),
            _ => Err(de::Error::custom("must be an array")),
        }
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        match self.value {
            Value::Null => visitor.visit_none(),
            _ => visitor.visit_some(self),
        }
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        self.value.deserialize_enum(name, variants, visitor)
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        unit unit_struct newtype_struct tuple tuple_struct identifier ignored_any
    }
}

struct Members<'p> {
    iter: <Map<String, Value> as IntoIterator>::IntoIter,
    value: Option<(String, Value)>,
    path: &'p mut Vec<Segment>,
}

impl<'de> MapAccess<'de> for Members<'_> {
    type Error = serde_json::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Self::Error> {
        let Some((key, value)) = self.iter.next() else {
            return Ok(None);
        };
        // An unknown key is an error of the key: the path names it.
        self.path.push(Segment::Key(key.clone()));
        let read = seed.deserialize(key.as_str().into_deserializer())?;
        self.path.pop();
        self.value = Some((key, value));
        Ok(Some(read))
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(
        &mut self,
        seed: V,
    ) -> Result<V::Value, Self::Error> {
        let (key, value) = self
            .value
            .take()
            .ok_or_else(|| de::Error::custom("a value without its key"))?;
        self.path.push(Segment::Key(key));
        let read = seed.deserialize(At {
            value,
            path: self.path,
        })?;
        self.path.pop();
        Ok(read)
    }
}

struct Items<'p> {
    iter: std::iter::Enumerate<std::vec::IntoIter<Value>>,
    path: &'p mut Vec<Segment>,
}

impl<'de> SeqAccess<'de> for Items<'_> {
    type Error = serde_json::Error;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, Self::Error> {
        let Some((index, value)) = self.iter.next() else {
            return Ok(None);
        };
        self.path.push(Segment::Index(index));
        let read = seed.deserialize(At {
            value,
            path: self.path,
        })?;
        self.path.pop();
        Ok(Some(read))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Deserialize, Debug)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Inner {
        cluster: Option<String>,
    }

    #[derive(Deserialize, Debug)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Outer {
        tokenizer: Option<Inner>,
        routes: Option<Vec<Outer>>,
        n: Option<u32>,
    }

    fn path_of(json: &str) -> Vec<Segment> {
        let value: Value = serde_json::from_str(json).unwrap();
        deserialize::<Outer>(value).unwrap_err().path
    }

    fn key(k: &str) -> Segment {
        Segment::Key(k.to_string())
    }

    #[test]
    fn the_path_ends_where_the_error_is() {
        assert_eq!(path_of(r#"{"colour":1}"#), vec![key("colour")]);
        assert_eq!(
            path_of(r#"{"tokenizer":{"tiemout":1}}"#),
            vec![key("tokenizer"), key("tiemout")]
        );
        assert_eq!(
            path_of(r#"{"n":1,"routes":[{},{"tokenizer":{"cluster":5}}]}"#),
            vec![
                key("routes"),
                Segment::Index(1),
                key("tokenizer"),
                key("cluster")
            ]
        );
        assert_eq!(path_of(r#"{"n":-1}"#), vec![key("n")]);
        assert_eq!(path_of(r#"{"routes":{}}"#), vec![key("routes")]);
        assert_eq!(path_of(r#"[]"#), vec![]);
        let ok: Outer =
            deserialize(serde_json::from_str(r#"{"n":null,"routes":[{"n":3}]}"#).unwrap()).unwrap();
        assert_eq!(ok.routes.map(|r| r.len()), Some(1));
    }
}
