//! `SmallMap`: the model's small sorted maps (labels, variables, replicas, roles, secret keys).
//!
//! Most of these maps hold one to three entries, where a `BTreeMap`'s first leaf holds eleven
//! slots: half a kilobyte for two strings, 30 MB of a 10,000-environment plan's 66 MB heap. A
//! `LiteMap` is a vector of pairs searched by bisection. It is wrapped so that it serialises
//! exactly as a `BTreeMap` did (litemap writes an empty map as a JSON sequence): every hash of
//! a spec, object and deployment stays what it was, so upgrading starts no new generation.

use litemap::LiteMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer, ser::SerializeMap};
use std::ops::{Deref, DerefMut};

/// A map kept sorted by key, as a vector of pairs; later inserts of a key win, as in a B-tree.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SmallMap<K, V>(LiteMap<K, V>);

impl<K, V> SmallMap<K, V> {
    /// An empty map; allocates nothing.
    pub const fn new() -> Self {
        Self(LiteMap::new_vec())
    }

    /// Whether the map holds no entry (named for `skip_serializing_if`).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl<K, V> Default for SmallMap<K, V> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K, V> Deref for SmallMap<K, V> {
    type Target = LiteMap<K, V>;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl<K, V> DerefMut for SmallMap<K, V> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}

impl<K: Ord, V> FromIterator<(K, V)> for SmallMap<K, V> {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Self {
        Self(iter.into_iter().collect())
    }
}

impl<K: Ord, V> Extend<(K, V)> for SmallMap<K, V> {
    fn extend<I: IntoIterator<Item = (K, V)>>(&mut self, iter: I) {
        self.0.extend(iter);
    }
}

impl<K, V> IntoIterator for SmallMap<K, V> {
    type Item = (K, V);
    type IntoIter = std::vec::IntoIter<(K, V)>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.into_tuple_vec().into_iter()
    }
}

impl<'a, K, V> IntoIterator for &'a SmallMap<K, V> {
    type Item = (&'a K, &'a V);
    type IntoIter = std::iter::Map<std::slice::Iter<'a, (K, V)>, fn(&'a (K, V)) -> (&'a K, &'a V)>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.as_slice().iter().map(|(k, v)| (k, v))
    }
}

impl<K: Serialize, V: Serialize> Serialize for SmallMap<K, V> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(self.0.len()))?;
        for (k, v) in self.0.iter() {
            m.serialize_entry(k, v)?;
        }
        m.end()
    }
}

impl<'de, K: Deserialize<'de> + Ord, V: Deserialize<'de>> Deserialize<'de> for SmallMap<K, V> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // litemap reads a map as a B-tree did (a key twice: the last wins), appending in place
        // when the keys come sorted, as stored specs always do.
        LiteMap::deserialize(d).map(Self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn serialises_as_a_b_tree_did_so_hashes_stay() {
        let empty: SmallMap<String, u32> = SmallMap::new();
        let b_empty: BTreeMap<String, u32> = BTreeMap::new();
        assert_eq!(serde_json::to_string(&empty).ok(), serde_json::to_string(&b_empty).ok());
        let pairs = [("web", 2u32), ("api", 1), ("worker", 3)];
        let small: SmallMap<String, u32> = pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect();
        let tree: BTreeMap<String, u32> = pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect();
        assert_eq!(serde_json::to_string(&small).ok(), serde_json::to_string(&tree).ok());
        assert_eq!(
            serde_json::to_string(&small).ok().as_deref(),
            Some(r#"{"api":1,"web":2,"worker":3}"#)
        );
        let back: SmallMap<String, u32> = serde_json::from_str(r#"{"worker":3,"api":1,"web":2}"#).expect("reads");
        assert_eq!(back, small);
        let twice: SmallMap<String, u32> = serde_json::from_str(r#"{"web":1,"api":1,"web":2}"#).expect("reads");
        let b_twice: BTreeMap<String, u32> = serde_json::from_str(r#"{"web":1,"api":1,"web":2}"#).expect("reads");
        assert_eq!(
            twice.get("web"),
            b_twice.get("web"),
            "a key twice reads as a B-tree read it"
        );
    }

    #[test]
    fn later_entries_win_and_order_is_by_key() {
        let mut m: SmallMap<String, &str> = [("b".to_owned(), "1"), ("a".to_owned(), "2")].into_iter().collect();
        m.extend([("b".to_owned(), "3")]);
        let got: Vec<_> = (&m).into_iter().map(|(k, v)| (k.as_str(), *v)).collect();
        assert_eq!(got, vec![("a", "2"), ("b", "3")]);
    }
}
