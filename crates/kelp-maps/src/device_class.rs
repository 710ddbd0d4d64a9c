//! Device classes and the replicated rules that use them (`osd crush set-device-class`,
//! `rm-device-class`, `rule create-replicated`), and the choice of the fastest class present
//! (where `kelp up` puts a file system's metadata pool, as the QCT guide recommends).
//!
//! A device's class lives in the CRUSH map (`device N osd.N class C`); the shadow trees that
//! rules with `take ROOT class C` start from are rebuilt whenever the map is finalized. Each
//! decision here returns one incremental that replaces the CRUSH map (`Change::SetCrush`), so
//! every monitor applies it identically. An OSD bound to a class is not moved to another one
//! silently: the old class is removed first, as Ceph requires.

use kelp_crush::{ItemId, RULE_TYPE_REPLICATED, Rule, Step};

use crate::error::MapError;
use crate::osdmap::{Change, Incremental, OsdMap};

/// Device classes Kelp knows the speed of, fastest first.
pub const CLASSES_BY_SPEED: [&str; 3] = ["nvme", "ssd", "hdd"];

/// The fastest of `classes` by [`CLASSES_BY_SPEED`]; classes of unknown speed never win.
pub fn fastest_device_class<'a>(classes: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    classes
        .into_iter()
        .filter_map(|c| {
            CLASSES_BY_SPEED
                .iter()
                .position(|k| *k == c)
                .map(|r| (r, c))
        })
        .min_by_key(|(rank, _)| *rank)
        .map(|(_, c)| c)
}

impl OsdMap {
    /// The device classes of OSDs that are in (weight > 0) and placed under `root`, each with
    /// how many distinct buckets of type `failure_domain` hold them.
    pub fn device_classes_under(
        &self,
        root: &str,
        failure_domain: &str,
    ) -> Result<Vec<(String, u32)>, MapError> {
        let (root_id, domain) = self.root_and_domain(root, failure_domain)?;
        let mut out = Vec::new();
        let mut names: Vec<&str> = self
            .crush
            .devices()
            .filter(|d| self.osds.get(&d.id).is_some_and(|o| o.is_in()))
            .filter_map(|d| self.crush.device_class(d.id))
            .collect();
        names.sort_unstable();
        names.dedup();
        for name in names {
            let take = self
                .crush
                .class_id(name)
                .and_then(|c| self.crush.shadow_of(root_id, c));
            if let Some(take) = take {
                let n = self.domains_under(take, domain);
                if n > 0 {
                    out.push((name.to_string(), n));
                }
            }
        }
        Ok(out)
    }

    /// The fastest device class under `root` that spans at least `size` failure domains of
    /// type `failure_domain` (a replicated pool of that size stays whole on it); `None` when
    /// no class of known speed does.
    pub fn fastest_class_for(
        &self,
        root: &str,
        failure_domain: &str,
        size: u32,
    ) -> Result<Option<String>, MapError> {
        let classes = self.device_classes_under(root, failure_domain)?;
        Ok(fastest_device_class(
            classes
                .iter()
                .filter(|(_, n)| *n >= size)
                .map(|(c, _)| c.as_str()),
        )
        .map(str::to_string))
    }

    fn root_and_domain(&self, root: &str, failure_domain: &str) -> Result<(ItemId, u32), MapError> {
        let root_id = self
            .crush
            .item_id(root)
            .filter(|&id| self.crush.bucket(id).is_some_and(|b| b.shadow_of.is_none()))
            .ok_or_else(|| MapError::InvalidValue {
                field: "root",
                reason: format!("'{root}' is not a bucket of the CRUSH map"),
            })?;
        let domain = self
            .crush
            .type_id(failure_domain)
            .ok_or_else(|| MapError::InvalidValue {
                field: "failure_domain",
                reason: format!(
                    "'{failure_domain}' is not a CRUSH type (known: {})",
                    self.crush
                        .types()
                        .map(|(_, n)| n)
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            })?;
        Ok((root_id, domain))
    }

    fn check_osds(&self, osds: &[i32]) -> Result<(), MapError> {
        if osds.is_empty() {
            return Err(MapError::InvalidValue {
                field: "osd",
                reason: "name at least one OSD".into(),
            });
        }
        for id in osds {
            if !self.osds.contains_key(id) || !self.crush.devices().any(|d| d.id == *id) {
                return Err(MapError::NoSuchOsd(*id));
            }
        }
        Ok(())
    }

    /// `osd crush set-device-class CLASS OSD...`: binds the OSDs to `class` (created if new).
    /// An OSD already of another class is refused (remove its class first); `None` when every
    /// OSD already has the class.
    pub fn propose_set_device_class(
        &self,
        class: &str,
        osds: &[i32],
    ) -> Result<Option<Incremental>, MapError> {
        self.check_osds(osds)?;
        let mut crush = self.crush.clone();
        let mut changed = false;
        for &id in osds {
            match self.crush.device_class(id) {
                Some(c) if c == class => {}
                Some(c) => {
                    return Err(MapError::InvalidValue {
                        field: "class",
                        reason: format!(
                            "osd.{id} has device class '{c}' already: remove it first \
                             (osd crush rm-device-class {id})"
                        ),
                    });
                }
                None => {
                    crush.set_device_class(id, Some(class))?;
                    changed = true;
                }
            }
        }
        if !changed {
            return Ok(None);
        }
        crush.finalize()?;
        Ok(Some(self.next(vec![Change::SetCrush(crush.to_text())])))
    }

    /// `osd crush rm-device-class OSD...`: the OSDs lose their class (`None` if none had one).
    pub fn propose_rm_device_class(&self, osds: &[i32]) -> Result<Option<Incremental>, MapError> {
        self.check_osds(osds)?;
        let mut crush = self.crush.clone();
        let mut changed = false;
        for &id in osds {
            if self.crush.device_class(id).is_some() {
                crush.set_device_class(id, None)?;
                changed = true;
            }
        }
        if !changed {
            return Ok(None);
        }
        crush.finalize()?;
        Ok(Some(self.next(vec![Change::SetCrush(crush.to_text())])))
    }

    /// `osd crush rule create-replicated NAME ROOT FAILURE_DOMAIN [CLASS]`: a replicated rule
    /// taking `root` (its shadow tree for `class`) with one replica per bucket of type
    /// `failure_domain`. An unknown root, type or class (no OSD of it under the root) is
    /// refused; an existing rule of that name is kept (`None`), as in Ceph.
    pub fn propose_replicated_rule(
        &self,
        name: &str,
        root: &str,
        failure_domain: &str,
        class: Option<&str>,
    ) -> Result<Option<Incremental>, MapError> {
        if let Some(existing) = self.crush.rule_by_name(name) {
            if existing.rule_type != RULE_TYPE_REPLICATED {
                return Err(MapError::InvalidValue {
                    field: "name",
                    reason: format!("rule '{name}' exists and is not a replicated rule"),
                });
            }
            return Ok(None);
        }
        if name.is_empty() || name.chars().any(char::is_whitespace) {
            return Err(MapError::InvalidValue {
                field: "name",
                reason: format!("'{name}' is not a valid rule name"),
            });
        }
        let (root_id, domain) = self.root_and_domain(root, failure_domain)?;
        let take = match class {
            None => root_id,
            Some(c) => self
                .crush
                .class_id(c)
                .and_then(|id| self.crush.shadow_of(root_id, id))
                .filter(|&shadow| self.crush.bucket(shadow).is_some_and(|b| b.weight > 0))
                .ok_or_else(|| MapError::InvalidValue {
                    field: "class",
                    reason: format!(
                        "no OSD of device class '{c}' under root {root} (classes there: {})",
                        self.device_classes_under(root, "osd")
                            .map(|v| v.into_iter().map(|(c, _)| c).collect::<Vec<_>>().join(", "))
                            .unwrap_or_default()
                    ),
                })?,
        };
        let mut crush = self.crush.clone();
        let id = crush.free_rule_id();
        let mut rule = Rule::replicated(id, name, take, domain);
        // Ceph's shape for a rule whose failure domain is the device itself: `choose`, as
        // `chooseleaf` of type 0 means the same but reads oddly
        if domain == 0
            && let Some(Step::Choose { leaf, .. }) = rule.steps.get_mut(1)
        {
            *leaf = false;
        }
        crush.add_rule(rule)?;
        crush.finalize()?;
        Ok(Some(self.next(vec![Change::SetCrush(crush.to_text())])))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// `n` OSDs up and in, osd.i on host(i % 3).
    fn cluster(n: i32) -> OsdMap {
        crate::osdmap::tests::cluster(n, "host")
    }

    fn apply(map: &mut OsdMap, inc: Option<Incremental>) {
        map.apply(&inc.expect("a change")).unwrap();
    }

    #[test]
    fn fastest_known_class_wins() {
        assert_eq!(fastest_device_class(["hdd", "ssd"]), Some("ssd"));
        assert_eq!(fastest_device_class(["ssd", "nvme", "hdd"]), Some("nvme"));
        assert_eq!(fastest_device_class(["hdd"]), Some("hdd"));
        assert_eq!(fastest_device_class(["tape", "hdd"]), Some("hdd"));
        assert_eq!(fastest_device_class(["tape"]), None);
        assert_eq!(fastest_device_class([]), None);
    }

    #[test]
    fn set_and_remove_device_classes() {
        let mut map = cluster(6);
        let inc = map.propose_set_device_class("ssd", &[0, 1, 2]).unwrap();
        apply(&mut map, inc);
        assert_eq!(map.crush.device_class(1), Some("ssd"));
        // again: nothing to do
        assert!(
            map.propose_set_device_class("ssd", &[0, 1])
                .unwrap()
                .is_none()
        );
        // another class is refused until the old one is removed
        let e = map.propose_set_device_class("hdd", &[2, 3]).unwrap_err();
        assert!(e.to_string().contains("rm-device-class 2"), "{e}");
        assert!(matches!(
            map.propose_set_device_class("hdd", &[9]),
            Err(MapError::NoSuchOsd(9))
        ));
        assert!(map.propose_set_device_class("bad name", &[3]).is_err());
        let inc = map.propose_rm_device_class(&[2]).unwrap();
        apply(&mut map, inc);
        assert_eq!(map.crush.device_class(2), None);
        let inc = map.propose_set_device_class("hdd", &[2, 3, 4, 5]).unwrap();
        apply(&mut map, inc);
        assert_eq!(
            map.device_classes_under("default", "host").unwrap(),
            vec![("hdd".to_string(), 3), ("ssd".to_string(), 2)]
        );
        // survives the text round trip every monitor applies
        let again = kelp_crush::parse_text(&map.crush.to_text()).unwrap();
        assert_eq!(again.device_class(0), Some("ssd"));
        assert_eq!(again.device_class(5), Some("hdd"));
    }

    #[test]
    fn the_fastest_class_must_span_the_pool_size() {
        let mut map = cluster(6);
        assert_eq!(map.fastest_class_for("default", "host", 3).unwrap(), None);
        let inc = map.propose_set_device_class("hdd", &[0, 1, 2]).unwrap();
        apply(&mut map, inc);
        // nvme on two hosts only: too few for size 3 across hosts, enough across OSDs
        let inc = map.propose_set_device_class("nvme", &[3, 4]).unwrap();
        apply(&mut map, inc);
        let inc = map.propose_set_device_class("ssd", &[5]).unwrap();
        apply(&mut map, inc);
        assert_eq!(
            map.fastest_class_for("default", "host", 3).unwrap(),
            Some("hdd".into())
        );
        assert_eq!(
            map.fastest_class_for("default", "host", 2).unwrap(),
            Some("nvme".into())
        );
        assert_eq!(
            map.fastest_class_for("default", "osd", 1).unwrap(),
            Some("nvme".into())
        );
        // a class whose only OSD is out is not present
        let inc = map.propose_osd_weight(5, 0).unwrap();
        apply(&mut map, inc);
        assert_eq!(
            map.device_classes_under("default", "osd").unwrap(),
            vec![("hdd".to_string(), 3), ("nvme".to_string(), 2)]
        );
        assert!(map.fastest_class_for("nowhere", "host", 1).is_err());
        assert!(map.fastest_class_for("default", "rack-ish", 1).is_err());
    }

    #[test]
    fn replicated_rules_take_the_class_shadow_tree() {
        let mut map = cluster(6);
        let inc = map.propose_set_device_class("ssd", &[0, 3]).unwrap();
        apply(&mut map, inc);
        let inc = map
            .propose_replicated_rule("fast", "default", "osd", Some("ssd"))
            .unwrap();
        apply(&mut map, inc);
        let text = map.crush.to_text();
        assert!(
            text.contains("\tstep take default class ssd\n\tstep choose firstn 0 type osd\n"),
            "{text}"
        );
        // an existing name is kept
        assert!(
            map.propose_replicated_rule("fast", "default", "host", None)
                .unwrap()
                .is_none()
        );
        for (root, domain, class, what) in [
            ("nowhere", "host", None, "root"),
            ("default", "shelf", None, "failure_domain"),
            ("default", "host", Some("nvme"), "device class 'nvme'"),
        ] {
            let e = map
                .propose_replicated_rule("r", root, domain, class)
                .unwrap_err();
            assert!(e.to_string().contains(what), "{e}");
        }
        // a pool on the rule maps only to the class's OSDs
        let spec = crate::PoolSpec {
            name: "meta".into(),
            pg_num: Some(16),
            size: Some(2),
            crush_rule: Some("fast".into()),
            ..Default::default()
        };
        let (id, inc) = map.propose_pool_create(&spec).unwrap();
        map.apply(&inc).unwrap();
        for ps in 0..16 {
            let pg = kelp_types::PgId::new(id, ps);
            let m = map.pg_mapping(pg).unwrap();
            let mut up: Vec<i32> = m.up_osds().collect();
            up.sort_unstable();
            assert_eq!(up, vec![0, 3], "{pg}");
        }
    }
}
