//! PG mappings of one OSD map, computed once. Every client op and every op an OSD serves needs
//! the acting set of its PG; computing it runs CRUSH (1.4 % of all CPU in a cluster profile of
//! replicated 4 KiB writes). A shared map never changes (a new epoch is a new `Arc`), so the
//! mappings of the map last asked about are kept, keyed by PG, and dropped when a different map
//! is asked about.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use kelp_types::PgId;

use crate::{MapError, OsdMap, PgMapping};

/// At most this many mappings are kept (then the cache starts over): bounds memory for maps
/// with very many PGs.
const MAX_ENTRIES: usize = 1 << 16;

/// A map and the mappings computed from it so far.
type Entries = (Arc<OsdMap>, HashMap<PgId, Arc<PgMapping>>);

/// Mappings of the last map asked about. See the module documentation.
#[derive(Default)]
pub struct MappingCache {
    inner: Mutex<Option<Entries>>,
}

impl MappingCache {
    pub fn new() -> Self {
        Self::default()
    }

    /// `map.pg_mapping(pg)`, computed once per map (maps are told apart by their `Arc`, so the
    /// map must not be changed while shared, which `Arc` already ensures). Shared, so a hit
    /// allocates nothing.
    pub fn get(&self, map: &Arc<OsdMap>, pg: PgId) -> Result<Arc<PgMapping>, MapError> {
        let mut guard = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let fresh = match &*guard {
            Some((m, entries)) => !Arc::ptr_eq(m, map) || entries.len() >= MAX_ENTRIES,
            None => true,
        };
        if fresh {
            *guard = Some((map.clone(), HashMap::new()));
        }
        let (_, entries) = guard.as_mut().expect("set above");
        if let Some(m) = entries.get(&pg) {
            return Ok(m.clone());
        }
        let m = Arc::new(map.pg_mapping(pg)?);
        entries.insert(pg, m.clone());
        Ok(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster() -> (OsdMap, u32) {
        let mut map = crate::osdmap::tests::cluster(4, "osd");
        let (pool, inc) = map
            .propose_pool_create(&crate::PoolSpec {
                name: "p".into(),
                pg_num: Some(8),
                ..crate::PoolSpec::default()
            })
            .unwrap();
        map.apply(&inc).unwrap();
        (map, pool)
    }

    #[test]
    fn follows_the_map_it_is_given() {
        let (map, pool) = cluster();
        let a = Arc::new(map);
        let cache = MappingCache::new();
        let pg = PgId::new(pool, 5);
        assert_eq!(*cache.get(&a, pg).unwrap(), a.pg_mapping(pg).unwrap());
        assert_eq!(*cache.get(&a, pg).unwrap(), a.pg_mapping(pg).unwrap());
        // A new map (the primary marked down) is a new Arc: its mapping, not the cached one.
        let first = a.pg_mapping(pg).unwrap().acting_primary;
        let mut next = (*a).clone();
        next.apply(&next.propose_osd_down(first).unwrap().unwrap())
            .unwrap();
        let b = Arc::new(next);
        let mb = cache.get(&b, pg).unwrap();
        assert_eq!(*mb, b.pg_mapping(pg).unwrap());
        assert!(!mb.acting.contains(&first));
        // Unknown pools are errors, asked once or again.
        assert!(cache.get(&b, PgId::new(pool + 99, 0)).is_err());
        assert!(cache.get(&b, PgId::new(pool + 99, 0)).is_err());
    }
}
