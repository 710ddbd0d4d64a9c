//! The CRUSH map model: tunables, devices, types, buckets (with device-class shadow trees),
//! rules. A `CrushMap` is built by the text parser or programmatically, then `finalize`d, which
//! validates it and derives what mapping needs (shadow trees, `max_devices`, bucket weights).
//!
//! Invariants after `finalize`: every bucket item refers to an existing device or bucket; the
//! bucket graph has no cycles; ids and names are unique; every bucket is straw2 with the
//! rjenkins1 hash; shadow buckets exist for every (root, class) pair.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::error::{CrushError, Result};

/// An item id: devices are `>= 0`, buckets `< 0`.
pub type ItemId = i32;

/// A hole in an `indep` result: this position could not be filled.
pub const ITEM_NONE: ItemId = 0x7fff_ffff;
/// Internal marker for a not-yet-chosen `indep` position.
pub(crate) const ITEM_UNDEF: ItemId = 0x7fff_fffe;

/// Fixed-point 16.16 weight of a fully-in device (`1.0`).
pub const WEIGHT_ONE: u32 = 0x10000;

/// Bucket algorithm ids as in Ceph's binary map and `allowed_bucket_algs`.
pub const ALG_UNIFORM: u8 = 1;
pub const ALG_LIST: u8 = 2;
pub const ALG_TREE: u8 = 3;
pub const ALG_STRAW: u8 = 4;
pub const ALG_STRAW2: u8 = 5;

/// Rule types (`type replicated` / `type erasure`).
pub const RULE_TYPE_REPLICATED: u8 = 1;
pub const RULE_TYPE_ERASURE: u8 = 3;

/// CRUSH behaviour knobs. Names and meanings are Ceph's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tunables {
    pub choose_local_tries: u32,
    pub choose_local_fallback_tries: u32,
    pub choose_total_tries: u32,
    pub chooseleaf_descend_once: u32,
    pub chooseleaf_vary_r: u32,
    pub chooseleaf_stable: u32,
    pub straw_calc_version: u32,
    pub allowed_bucket_algs: u32,
}

impl Tunables {
    /// The "legacy" (argonaut) values: what a text map means when it names no tunables, and the
    /// baseline the text writer compares against (as Ceph's decompiler does).
    pub fn legacy() -> Self {
        Tunables {
            choose_local_tries: 2,
            choose_local_fallback_tries: 5,
            choose_total_tries: 19,
            chooseleaf_descend_once: 0,
            chooseleaf_vary_r: 0,
            chooseleaf_stable: 0,
            straw_calc_version: 0,
            allowed_bucket_algs: (1 << ALG_UNIFORM) | (1 << ALG_LIST) | (1 << ALG_STRAW),
        }
    }

    /// The modern "optimal" (jewel) profile that Kelp creates maps with.
    pub fn optimal() -> Self {
        Tunables {
            choose_local_tries: 0,
            choose_local_fallback_tries: 0,
            choose_total_tries: 50,
            chooseleaf_descend_once: 1,
            chooseleaf_vary_r: 1,
            chooseleaf_stable: 1,
            straw_calc_version: 1,
            allowed_bucket_algs: (1 << ALG_UNIFORM)
                | (1 << ALG_LIST)
                | (1 << ALG_STRAW)
                | (1 << ALG_STRAW2),
        }
    }

    /// (text name, value) pairs in Ceph's order.
    pub fn entries(&self) -> [(&'static str, u32); 8] {
        [
            ("choose_local_tries", self.choose_local_tries),
            (
                "choose_local_fallback_tries",
                self.choose_local_fallback_tries,
            ),
            ("choose_total_tries", self.choose_total_tries),
            ("chooseleaf_descend_once", self.chooseleaf_descend_once),
            ("chooseleaf_vary_r", self.chooseleaf_vary_r),
            ("chooseleaf_stable", self.chooseleaf_stable),
            ("straw_calc_version", self.straw_calc_version),
            ("allowed_bucket_algs", self.allowed_bucket_algs),
        ]
    }

    /// Sets one tunable by its text name.
    pub fn set(&mut self, name: &str, value: u32) -> Result<()> {
        let slot = match name {
            "choose_local_tries" => &mut self.choose_local_tries,
            "choose_local_fallback_tries" => &mut self.choose_local_fallback_tries,
            "choose_total_tries" => &mut self.choose_total_tries,
            "chooseleaf_descend_once" => &mut self.chooseleaf_descend_once,
            "chooseleaf_vary_r" => &mut self.chooseleaf_vary_r,
            "chooseleaf_stable" => &mut self.chooseleaf_stable,
            "straw_calc_version" => &mut self.straw_calc_version,
            "allowed_bucket_algs" => &mut self.allowed_bucket_algs,
            other => {
                return Err(CrushError::UnknownTunable {
                    name: other.to_string(),
                });
            }
        };
        *slot = value;
        Ok(())
    }
}

/// A storage device (an OSD).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Device {
    pub id: ItemId,
    pub name: String,
    pub class: Option<u32>,
}

/// A straw2 bucket. Shadow buckets (`host0~ssd`) are derived copies restricted to one device
/// class; they are not written back to text except as `id N class C` lines of their original.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bucket {
    pub id: ItemId,
    pub name: String,
    pub type_id: u32,
    pub alg: u8,
    pub hash: u8,
    pub items: Vec<ItemId>,
    /// 16.16 fixed-point weight of each item, as stored in the parent (not recomputed).
    pub item_weights: Vec<u32>,
    /// Sum of `item_weights`.
    pub weight: u32,
    /// For a shadow bucket: (original bucket id, class id).
    pub shadow_of: Option<(ItemId, u32)>,
    /// Exact reciprocal of each item weight for straw2 draws (derived by `finalize`).
    pub(crate) divisors: Vec<crate::div::Divisor>,
}

/// One step of a rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Start from this item (a shadow bucket id when the text said `take X class C`).
    Take(ItemId),
    /// `choose`/`chooseleaf` `firstn`/`indep` `num` `type type_id`.
    Choose {
        leaf: bool,
        indep: bool,
        num: i32,
        type_id: u32,
    },
    Emit,
    SetChooseTries(i32),
    SetChooseleafTries(i32),
    SetChooseLocalTries(i32),
    SetChooseLocalFallbackTries(i32),
    SetChooseleafVaryR(i32),
    SetChooseleafStable(i32),
}

/// A placement rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub id: u32,
    pub name: String,
    pub rule_type: u8,
    pub min_size: u32,
    pub max_size: u32,
    pub steps: Vec<Step>,
}

impl Rule {
    /// The usual replicated rule: take `root`, choose one leaf under each of `num_rep` distinct
    /// buckets of type `failure_domain` (`chooseleaf firstn 0 type T`), emit.
    pub fn replicated(id: u32, name: &str, root: ItemId, failure_domain: u32) -> Rule {
        Rule {
            id,
            name: name.to_string(),
            rule_type: RULE_TYPE_REPLICATED,
            min_size: 1,
            max_size: 10,
            steps: vec![
                Step::Take(root),
                Step::Choose {
                    leaf: true,
                    indep: false,
                    num: 0,
                    type_id: failure_domain,
                },
                Step::Emit,
            ],
        }
    }

    /// The rule Ceph makes for an erasure-coded pool (`type erasure`): more tries than the
    /// tunables' defaults (an `indep` position that cannot be filled stays a hole, so CRUSH
    /// should work harder before giving up), take `take` (a root, or its shadow for a device
    /// class), one shard under each of `k+m` distinct buckets of type `failure_domain`
    /// (`chooseleaf indep 0 type T`; `choose indep 0 type osd` when the failure domain is the
    /// device type itself, id 0), emit. Positions are kept: shard `i` is the `i`-th result.
    pub fn erasure(id: u32, name: &str, take: ItemId, failure_domain: u32) -> Rule {
        Rule {
            id,
            name: name.to_string(),
            rule_type: RULE_TYPE_ERASURE,
            // Ceph's values for an `indep` rule (`CrushWrapper::add_simple_rule_at`); the
            // mapper does not check them.
            min_size: 3,
            max_size: 20,
            steps: vec![
                Step::SetChooseleafTries(5),
                Step::SetChooseTries(100),
                Step::Take(take),
                Step::Choose {
                    leaf: failure_domain != 0,
                    indep: true,
                    num: 0,
                    type_id: failure_domain,
                },
                Step::Emit,
            ],
        }
    }
}

/// A whole CRUSH map. Build with the `add_*` methods or `parse_text`, then call `finalize`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CrushMap {
    pub tunables: Tunables,
    pub(crate) devices: BTreeMap<ItemId, Device>,
    pub(crate) types: BTreeMap<u32, String>,
    pub(crate) classes: BTreeMap<u32, String>,
    /// Indexed by `-1 - id`.
    pub(crate) buckets: Vec<Option<Bucket>>,
    /// Indexed by rule id.
    pub(crate) rules: Vec<Option<Rule>>,
    /// original bucket id -> class id -> shadow bucket id (from `id N class C` lines or derived).
    pub(crate) class_bucket: BTreeMap<ItemId, BTreeMap<u32, ItemId>>,
    pub(crate) max_devices: i32,
    pub(crate) names: HashMap<String, ItemId>,
    pub(crate) finalized: bool,
}

impl Default for CrushMap {
    fn default() -> Self {
        Self::new()
    }
}

/// Ceph's standard type list (`osd` … `root`).
pub const DEFAULT_TYPES: [&str; 12] = [
    "osd",
    "host",
    "chassis",
    "rack",
    "row",
    "pdu",
    "pod",
    "room",
    "datacenter",
    "zone",
    "region",
    "root",
];

impl CrushMap {
    /// An empty map with optimal tunables and no types.
    pub fn new() -> Self {
        CrushMap {
            tunables: Tunables::optimal(),
            devices: BTreeMap::new(),
            types: BTreeMap::new(),
            classes: BTreeMap::new(),
            buckets: Vec::new(),
            rules: Vec::new(),
            class_bucket: BTreeMap::new(),
            max_devices: 0,
            names: HashMap::new(),
            finalized: false,
        }
    }

    /// An empty map with optimal tunables and Ceph's standard types.
    pub fn with_default_types() -> Self {
        let mut map = Self::new();
        for (i, name) in DEFAULT_TYPES.iter().enumerate() {
            map.types.insert(i as u32, (*name).to_string());
        }
        map
    }

    pub fn max_devices(&self) -> i32 {
        self.max_devices
    }

    pub fn devices(&self) -> impl Iterator<Item = &Device> {
        self.devices.values()
    }

    pub fn device(&self, id: ItemId) -> Option<&Device> {
        self.devices.get(&id)
    }

    /// All real (non-shadow) buckets, by id descending from -1.
    pub fn buckets(&self) -> impl Iterator<Item = &Bucket> {
        self.buckets
            .iter()
            .flatten()
            .filter(|b| b.shadow_of.is_none())
    }

    /// Every bucket including shadow buckets.
    pub fn all_buckets(&self) -> impl Iterator<Item = &Bucket> {
        self.buckets.iter().flatten()
    }

    pub fn bucket(&self, id: ItemId) -> Option<&Bucket> {
        if id >= 0 {
            return None;
        }
        self.buckets.get((-1 - id) as usize)?.as_ref()
    }

    pub fn rules(&self) -> impl Iterator<Item = &Rule> {
        self.rules.iter().flatten()
    }

    pub fn rule(&self, id: u32) -> Option<&Rule> {
        self.rules.get(id as usize)?.as_ref()
    }

    pub fn rule_by_name(&self, name: &str) -> Option<&Rule> {
        self.rules().find(|r| r.name == name)
    }

    pub fn types(&self) -> impl Iterator<Item = (u32, &str)> {
        self.types.iter().map(|(id, n)| (*id, n.as_str()))
    }

    pub fn type_id(&self, name: &str) -> Option<u32> {
        self.types
            .iter()
            .find(|(_, n)| *n == name)
            .map(|(id, _)| *id)
    }

    pub fn type_name(&self, id: u32) -> Option<&str> {
        self.types.get(&id).map(String::as_str)
    }

    pub fn class_id(&self, name: &str) -> Option<u32> {
        self.classes
            .iter()
            .find(|(_, n)| *n == name)
            .map(|(id, _)| *id)
    }

    pub fn class_name(&self, id: u32) -> Option<&str> {
        self.classes.get(&id).map(String::as_str)
    }

    /// The id of a device or (real or shadow) bucket by name.
    pub fn item_id(&self, name: &str) -> Option<ItemId> {
        self.names.get(name).copied()
    }

    pub fn item_name(&self, id: ItemId) -> Option<&str> {
        if id >= 0 {
            self.devices.get(&id).map(|d| d.name.as_str())
        } else {
            self.bucket(id).map(|b| b.name.as_str())
        }
    }

    /// Whether `id` is a device that some bucket holds (crushtool gives such devices weight
    /// 1.0 in its default reweight vector, others 0).
    pub fn device_is_placed(&self, id: ItemId) -> bool {
        self.buckets().any(|b| b.items.contains(&id))
    }

    /// Shadow bucket of `bucket` for `class`, if any.
    pub fn shadow_of(&self, bucket: ItemId, class: u32) -> Option<ItemId> {
        self.class_bucket.get(&bucket)?.get(&class).copied()
    }

    /// The reweight vector with every placed device fully in (what `crushtool --test` and an
    /// all-up-and-in OSD map use).
    pub fn default_reweights(&self) -> Vec<u32> {
        let mut placed = vec![false; self.max_devices.max(0) as usize];
        for b in self.buckets() {
            for &item in &b.items {
                if item >= 0 {
                    placed[item as usize] = true;
                }
            }
        }
        placed
            .into_iter()
            .map(|p| if p { WEIGHT_ONE } else { 0 })
            .collect()
    }

    // ---- building ------------------------------------------------------------------------

    fn check_name_free(&self, name: &str) -> Result<()> {
        if self.names.contains_key(name) {
            return Err(CrushError::Invalid(format!("name '{name}' is used twice")));
        }
        if name.is_empty() || name.contains('~') || name.chars().any(char::is_whitespace) {
            return Err(CrushError::Invalid(format!(
                "'{name}' is not a valid item name (no spaces, no '~', not empty)"
            )));
        }
        Ok(())
    }

    /// Defines a type (level of the hierarchy).
    pub fn add_type(&mut self, id: u32, name: &str) -> Result<()> {
        if self.types.contains_key(&id) {
            return Err(CrushError::Invalid(format!(
                "type id {id} is defined twice"
            )));
        }
        if self.type_id(name).is_some() {
            return Err(CrushError::Invalid(format!(
                "type '{name}' is defined twice"
            )));
        }
        self.types.insert(id, name.to_string());
        Ok(())
    }

    /// Returns the id of a device class, creating it (next free id) if needed.
    pub fn get_or_create_class(&mut self, name: &str) -> u32 {
        if let Some(id) = self.class_id(name) {
            return id;
        }
        let id = self.classes.keys().next_back().map_or(0, |last| last + 1);
        self.classes.insert(id, name.to_string());
        id
    }

    /// Defines a device.
    pub fn add_device(&mut self, id: ItemId, name: &str, class: Option<&str>) -> Result<()> {
        if id < 0 {
            return Err(CrushError::Invalid(format!("device id {id} must be >= 0")));
        }
        if self.devices.contains_key(&id) {
            return Err(CrushError::Invalid(format!(
                "device id {id} is defined twice"
            )));
        }
        self.check_name_free(name)?;
        let class = class.map(|c| self.get_or_create_class(c));
        self.devices.insert(
            id,
            Device {
                id,
                name: name.to_string(),
                class,
            },
        );
        self.names.insert(name.to_string(), id);
        self.finalized = false;
        Ok(())
    }

    /// Sets (or with `None` clears) the device class of device `id`, creating the class if
    /// needed. The shadow trees follow at the next [`CrushMap::finalize`]; a class keeps its
    /// id (and its shadow buckets theirs) when its last device leaves it, as in Ceph.
    pub fn set_device_class(&mut self, id: ItemId, class: Option<&str>) -> Result<()> {
        if let Some(c) = class
            && (c.is_empty() || c.contains('~') || c.chars().any(char::is_whitespace))
        {
            return Err(CrushError::Invalid(format!(
                "'{c}' is not a valid device class name (no spaces, no '~', not empty)"
            )));
        }
        let class = class.map(|c| self.get_or_create_class(c));
        let d = self
            .devices
            .get_mut(&id)
            .ok_or_else(|| CrushError::Invalid(format!("device {id} does not exist")))?;
        d.class = class;
        self.finalized = false;
        Ok(())
    }

    /// The device class of device `id`, if it has one.
    pub fn device_class(&self, id: ItemId) -> Option<&str> {
        self.devices
            .get(&id)
            .and_then(|d| d.class)
            .and_then(|c| self.class_name(c))
    }

    /// Adds a straw2 bucket. `id` None picks the first free negative id. Items are
    /// `(item id, Some(16.16 weight) or None)`; a missing weight means 1.0 for a device and the
    /// child's own weight for a bucket. Items must already exist. Returns the bucket's id.
    pub fn add_bucket(
        &mut self,
        id: Option<ItemId>,
        name: &str,
        type_id: u32,
        items: &[(ItemId, Option<u32>)],
    ) -> Result<ItemId> {
        self.check_name_free(name)?;
        if !self.types.contains_key(&type_id) {
            return Err(CrushError::Invalid(format!(
                "bucket '{name}' has undefined type id {type_id}"
            )));
        }
        if type_id == 0 {
            return Err(CrushError::Invalid(format!(
                "bucket '{name}' cannot have type id 0, which is the device type"
            )));
        }
        let id = match id {
            Some(id) if id >= 0 => {
                return Err(CrushError::Invalid(format!(
                    "bucket '{name}' has id {id}: bucket ids must be negative"
                )));
            }
            Some(id) => {
                if self.bucket(id).is_some() || self.reserved_shadow_ids().contains(&id) {
                    return Err(CrushError::Invalid(format!(
                        "bucket '{name}' reuses id {id}, which is already taken"
                    )));
                }
                id
            }
            None => self.free_bucket_id(&BTreeSet::new()),
        };
        let mut ids = Vec::with_capacity(items.len());
        let mut weights = Vec::with_capacity(items.len());
        for &(item, weight) in items {
            let default_weight = if item >= 0 {
                if !self.devices.contains_key(&item) {
                    return Err(CrushError::Invalid(format!(
                        "bucket '{name}' refers to device {item}, which is not defined"
                    )));
                }
                WEIGHT_ONE
            } else {
                match self.bucket(item) {
                    Some(b) if b.shadow_of.is_none() => b.weight,
                    _ => {
                        return Err(CrushError::Invalid(format!(
                            "bucket '{name}' refers to bucket {item}, which is not defined"
                        )));
                    }
                }
            };
            if item == id {
                return Err(CrushError::Invalid(format!(
                    "bucket '{name}' contains itself"
                )));
            }
            if ids.contains(&item) {
                return Err(CrushError::Invalid(format!(
                    "bucket '{name}' holds item '{}' twice",
                    self.item_name(item).unwrap_or("?")
                )));
            }
            ids.push(item);
            weights.push(weight.unwrap_or(default_weight));
        }
        let weight = sum_weights(name, &weights)?;
        let bucket = Bucket {
            id,
            name: name.to_string(),
            type_id,
            alg: ALG_STRAW2,
            hash: crate::hash::CRUSH_HASH_RJENKINS1,
            items: ids,
            item_weights: weights,
            weight,
            shadow_of: None,
            divisors: Vec::new(),
        };
        self.put_bucket(bucket);
        self.names.insert(name.to_string(), id);
        self.finalized = false;
        Ok(id)
    }

    /// Records a fixed id for the shadow bucket of `bucket` for `class` (text `id N class C`).
    pub fn set_shadow_id(&mut self, bucket: ItemId, class: &str, shadow: ItemId) -> Result<()> {
        if shadow >= 0 {
            return Err(CrushError::Invalid(format!(
                "shadow id {shadow} must be negative"
            )));
        }
        let taken = self.bucket(shadow).is_some() || self.reserved_shadow_ids().contains(&shadow);
        if taken {
            return Err(CrushError::Invalid(format!(
                "id {shadow} for class '{class}' is already taken"
            )));
        }
        let class = self.get_or_create_class(class);
        let per_class = self.class_bucket.entry(bucket).or_default();
        if per_class.contains_key(&class) {
            return Err(CrushError::Invalid(format!(
                "bucket {bucket} names two ids for one class"
            )));
        }
        per_class.insert(class, shadow);
        Ok(())
    }

    /// Adds a rule. Ids must be unique; `Take` items must exist.
    pub fn add_rule(&mut self, rule: Rule) -> Result<()> {
        if self.rule(rule.id).is_some() {
            return Err(CrushError::Invalid(format!(
                "rule id {} is defined twice",
                rule.id
            )));
        }
        if self.rule_by_name(&rule.name).is_some() {
            return Err(CrushError::Invalid(format!(
                "rule name '{}' is defined twice",
                rule.name
            )));
        }
        for step in &rule.steps {
            match *step {
                Step::Take(item) => {
                    let exists = if item >= 0 {
                        self.devices.contains_key(&item)
                    } else {
                        self.bucket(item).is_some()
                    };
                    if !exists {
                        return Err(CrushError::Invalid(format!(
                            "rule '{}' takes item {item}, which does not exist",
                            rule.name
                        )));
                    }
                }
                Step::Choose { type_id, .. } if !self.types.contains_key(&type_id) => {
                    return Err(CrushError::Invalid(format!(
                        "rule '{}' chooses undefined type id {type_id}",
                        rule.name
                    )));
                }
                _ => {}
            }
        }
        let idx = rule.id as usize;
        if self.rules.len() <= idx {
            self.rules.resize(idx + 1, None);
        }
        self.rules[idx] = Some(rule);
        Ok(())
    }

    /// The lowest rule id not in use (for a new rule).
    pub fn free_rule_id(&self) -> u32 {
        (0..).find(|&id| self.rule(id).is_none()).unwrap_or(0)
    }

    /// Removes rule `id` and returns it. Pools that use it are the caller's business.
    pub fn remove_rule(&mut self, id: u32) -> Result<Rule> {
        self.rules
            .get_mut(id as usize)
            .and_then(Option::take)
            .ok_or_else(|| CrushError::Invalid(format!("rule id {id} does not exist")))
    }

    /// Adds `item` (an existing device or bucket) to `bucket` with a 16.16 `weight`, and
    /// propagates the bucket's new weight to its parents (as `ceph osd crush add` does). Call
    /// `finalize` before mapping again.
    pub fn insert_item(&mut self, bucket: ItemId, item: ItemId, weight: u32) -> Result<()> {
        let exists = if item >= 0 {
            self.devices.contains_key(&item)
        } else {
            self.bucket(item).is_some_and(|b| b.shadow_of.is_none())
        };
        if !exists {
            return Err(CrushError::Invalid(format!("item {item} does not exist")));
        }
        if item == bucket || (item < 0 && self.is_ancestor(item, bucket)) {
            return Err(CrushError::Invalid(format!(
                "adding item {item} to bucket {bucket} would make a cycle"
            )));
        }
        let b = self.real_bucket_mut(bucket)?;
        if b.items.contains(&item) {
            return Err(CrushError::Invalid(format!(
                "bucket '{}' already holds item {item}",
                b.name
            )));
        }
        b.items.push(item);
        b.item_weights.push(weight);
        self.reweight_bucket(bucket)
    }

    /// Removes `item` from every bucket that holds it; propagates weights. A bucket must be
    /// empty to be removed from the tree.
    pub fn remove_item(&mut self, item: ItemId) -> Result<()> {
        if let Some(b) = self.bucket(item)
            && !b.items.is_empty()
        {
            return Err(CrushError::Invalid(format!(
                "bucket '{}' is not empty",
                b.name
            )));
        }
        for parent in self.parents_of(item) {
            let b = self.real_bucket_mut(parent)?;
            if let Some(pos) = b.items.iter().position(|&i| i == item) {
                b.items.remove(pos);
                b.item_weights.remove(pos);
            }
            self.reweight_bucket(parent)?;
        }
        self.finalized = false;
        Ok(())
    }

    /// Removes a device entirely: from every bucket (propagating weights) and from the device
    /// list, freeing its id and name.
    pub fn remove_device(&mut self, id: ItemId) -> Result<()> {
        let device = self
            .devices
            .get(&id)
            .ok_or_else(|| CrushError::Invalid(format!("device {id} does not exist")))?
            .clone();
        self.remove_item(id)?;
        self.devices.remove(&id);
        self.names.remove(&device.name);
        self.finalized = false;
        Ok(())
    }

    /// Sets the 16.16 CRUSH weight of `item` in every bucket that holds it; propagates.
    pub fn set_item_weight(&mut self, item: ItemId, weight: u32) -> Result<()> {
        let parents = self.parents_of(item);
        if parents.is_empty() {
            return Err(CrushError::Invalid(format!("item {item} is in no bucket")));
        }
        for parent in parents {
            let b = self.real_bucket_mut(parent)?;
            for (i, w) in b.items.iter().zip(b.item_weights.iter_mut()) {
                if *i == item {
                    *w = weight;
                }
            }
            self.reweight_bucket(parent)?;
        }
        Ok(())
    }

    /// The 16.16 weight of `item` in its (first) parent bucket.
    pub fn item_weight(&self, item: ItemId) -> Option<u32> {
        self.buckets().find_map(|b| {
            b.items
                .iter()
                .position(|&i| i == item)
                .map(|pos| b.item_weights[pos])
        })
    }

    /// Real buckets that hold `item` directly.
    pub fn parents_of(&self, item: ItemId) -> Vec<ItemId> {
        self.buckets()
            .filter(|b| b.items.contains(&item))
            .map(|b| b.id)
            .collect()
    }

    fn is_ancestor(&self, ancestor: ItemId, of: ItemId) -> bool {
        let mut stack = vec![of];
        let mut seen = BTreeSet::new();
        while let Some(cur) = stack.pop() {
            if cur == ancestor {
                return true;
            }
            if seen.insert(cur) {
                stack.extend(self.parents_of(cur));
            }
        }
        false
    }

    fn real_bucket_mut(&mut self, id: ItemId) -> Result<&mut Bucket> {
        self.finalized = false;
        match self
            .buckets
            .get_mut((-1 - id).max(0) as usize)
            .and_then(Option::as_mut)
        {
            Some(b) if id < 0 && b.shadow_of.is_none() => Ok(b),
            _ => Err(CrushError::Invalid(format!("bucket {id} does not exist"))),
        }
    }

    /// Recomputes a bucket's weight from its items and carries it up to every ancestor.
    fn reweight_bucket(&mut self, bucket: ItemId) -> Result<()> {
        let b = self.real_bucket_mut(bucket)?;
        let name = b.name.clone();
        b.weight = sum_weights(&name, &b.item_weights)?;
        let weight = b.weight;
        for parent in self.parents_of(bucket) {
            let p = self.real_bucket_mut(parent)?;
            for (i, w) in p.items.iter().zip(p.item_weights.iter_mut()) {
                if *i == bucket {
                    *w = weight;
                }
            }
            self.reweight_bucket(parent)?;
        }
        Ok(())
    }

    fn put_bucket(&mut self, bucket: Bucket) {
        let idx = (-1 - bucket.id) as usize;
        if self.buckets.len() <= idx {
            self.buckets.resize(idx + 1, None);
        }
        self.buckets[idx] = Some(bucket);
    }

    fn reserved_shadow_ids(&self) -> BTreeSet<ItemId> {
        self.class_bucket
            .values()
            .flat_map(|m| m.values().copied())
            .collect()
    }

    fn free_bucket_id(&self, also_used: &BTreeSet<ItemId>) -> ItemId {
        let reserved = self.reserved_shadow_ids();
        let mut id = -1;
        while self.bucket(id).is_some() || reserved.contains(&id) || also_used.contains(&id) {
            id -= 1;
        }
        id
    }

    /// Validates the map and derives shadow trees and `max_devices`. Must be called after
    /// building and before mapping.
    pub fn finalize(&mut self) -> Result<()> {
        // Drop previously derived shadow buckets; rebuild from the originals.
        for slot in self.buckets.iter_mut() {
            if slot.as_ref().is_some_and(|b| b.shadow_of.is_some())
                && let Some(b) = slot.take()
            {
                self.names.remove(&b.name);
            }
        }
        self.check_acyclic()?;
        self.build_shadow_trees()?;
        let max_item = self
            .buckets()
            .flat_map(|b| b.items.iter().copied())
            .chain(self.devices.keys().copied())
            .max()
            .unwrap_or(-1);
        self.max_devices = max_item.max(-1) + 1;
        for b in self.buckets.iter_mut().flatten() {
            b.divisors = b
                .item_weights
                .iter()
                .map(|&w| crate::div::Divisor::new(w))
                .collect();
        }
        self.finalized = true;
        Ok(())
    }

    fn check_acyclic(&self) -> Result<()> {
        // 0 = unvisited, 1 = on the stack, 2 = done.
        let mut state: HashMap<ItemId, u8> = HashMap::new();
        fn visit(map: &CrushMap, id: ItemId, state: &mut HashMap<ItemId, u8>) -> Result<()> {
            match state.get(&id) {
                Some(2) => return Ok(()),
                Some(1) => {
                    return Err(CrushError::Invalid(format!(
                        "bucket '{}' is part of a cycle",
                        map.item_name(id).unwrap_or("?")
                    )));
                }
                _ => {}
            }
            state.insert(id, 1);
            if let Some(b) = map.bucket(id) {
                for &item in &b.items {
                    if item < 0 {
                        visit(map, item, state)?;
                    }
                }
            }
            state.insert(id, 2);
            Ok(())
        }
        for b in self.buckets() {
            visit(self, b.id, &mut state)?;
        }
        Ok(())
    }

    /// Ids of real buckets that no other real bucket contains.
    fn roots(&self) -> Vec<ItemId> {
        let children: BTreeSet<ItemId> = self
            .buckets()
            .flat_map(|b| b.items.iter().copied())
            .collect();
        let mut roots: Vec<ItemId> = self
            .buckets()
            .map(|b| b.id)
            .filter(|id| !children.contains(id))
            .collect();
        roots.sort_unstable();
        roots
    }

    /// Builds, for every root and every device class, a copy of the tree that holds only that
    /// class's devices (as Ceph does): leaf buckets keep their matching devices with their item
    /// weights, upper buckets hold every child's shadow with the shadow's summed weight.
    fn build_shadow_trees(&mut self) -> Result<()> {
        let fixed = self.reserved_shadow_ids();
        let classes: Vec<u32> = self.classes.keys().copied().collect();
        for root in self.roots() {
            for &class in &classes {
                self.clone_for_class(root, class, &fixed)?;
            }
        }
        // Any `id N class C` line for a bucket that got no shadow is a dangling reservation.
        for (&orig, per_class) in &self.class_bucket {
            if self.bucket(orig).is_none() {
                return Err(CrushError::Invalid(format!(
                    "class ids are given for bucket {orig}, which does not exist"
                )));
            }
            for &shadow in per_class.values() {
                if self.bucket(shadow).is_none() {
                    return Err(CrushError::Invalid(format!(
                        "shadow id {shadow} of bucket {orig} was never built"
                    )));
                }
            }
        }
        Ok(())
    }

    fn clone_for_class(
        &mut self,
        original: ItemId,
        class: u32,
        fixed: &BTreeSet<ItemId>,
    ) -> Result<ItemId> {
        let class_name = self.classes[&class].clone();
        let orig = self
            .bucket(original)
            .ok_or_else(|| CrushError::Invalid(format!("bucket {original} does not exist")))?
            .clone();
        let copy_name = format!("{}~{}", orig.name, class_name);
        if let Some(&existing) = self.names.get(&copy_name) {
            return Ok(existing);
        }
        let mut items = Vec::new();
        let mut weights = Vec::new();
        for (&item, &w) in orig.items.iter().zip(&orig.item_weights) {
            if item >= 0 {
                if self.devices.get(&item).and_then(|d| d.class) == Some(class) {
                    items.push(item);
                    weights.push(w);
                }
            } else {
                let child = self.clone_for_class(item, class, fixed)?;
                let child_weight = self.bucket(child).map_or(0, |b| b.weight);
                items.push(child);
                weights.push(child_weight);
            }
        }
        let id = match self.shadow_of(original, class) {
            Some(id) => id,
            None => {
                let id = self.free_bucket_id(fixed);
                self.class_bucket
                    .entry(original)
                    .or_default()
                    .insert(class, id);
                id
            }
        };
        if self.bucket(id).is_some() {
            return Err(CrushError::Invalid(format!(
                "shadow id {id} for '{copy_name}' collides with another bucket"
            )));
        }
        let weight = sum_weights(&copy_name, &weights)?;
        self.put_bucket(Bucket {
            id,
            name: copy_name.clone(),
            type_id: orig.type_id,
            alg: orig.alg,
            hash: orig.hash,
            items,
            item_weights: weights,
            weight,
            shadow_of: Some((original, class)),
            divisors: Vec::new(),
        });
        self.names.insert(copy_name, id);
        Ok(id)
    }
}

fn sum_weights(name: &str, weights: &[u32]) -> Result<u32> {
    weights
        .iter()
        .try_fold(0u32, |acc, &w| acc.checked_add(w))
        .ok_or_else(|| CrushError::Invalid(format!("bucket '{name}' weight overflows 65535.0")))
}

/// Converts a text weight to 16.16 fixed point exactly as Ceph's compiler does: the value is a
/// 32-bit float, multiplied in float by 65536 and truncated (so `4.097` gives 268501).
pub fn weight_from_f32(w: f32) -> Option<u32> {
    let scaled = w * 65536.0f32;
    if !scaled.is_finite() || !(0.0..4_294_967_296.0).contains(&scaled) {
        return None;
    }
    Some(scaled as u32)
}

/// Formats a 16.16 weight as Ceph's decompiler does (`%.3f` of a float).
pub fn format_weight(w: u32) -> String {
    format!("{:.3}", w as f32 / 65536.0f32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tree_edits_propagate_weights() {
        let mut map = CrushMap::with_default_types();
        let root = map.add_bucket(None, "default", 11, &[]).unwrap();
        let host = map.add_bucket(None, "host0", 1, &[]).unwrap();
        map.insert_item(root, host, 0).unwrap();
        map.add_device(0, "osd.0", None).unwrap();
        map.add_device(1, "osd.1", None).unwrap();
        map.insert_item(host, 0, WEIGHT_ONE).unwrap();
        map.insert_item(host, 1, 2 * WEIGHT_ONE).unwrap();
        assert_eq!(map.bucket(host).unwrap().weight, 3 * WEIGHT_ONE);
        assert_eq!(map.item_weight(host), Some(3 * WEIGHT_ONE));
        assert_eq!(map.bucket(root).unwrap().weight, 3 * WEIGHT_ONE);
        map.set_item_weight(1, WEIGHT_ONE / 2).unwrap();
        assert_eq!(map.bucket(root).unwrap().weight, WEIGHT_ONE * 3 / 2);
        assert!(map.insert_item(host, root, 1).is_err(), "cycle");
        assert!(map.remove_item(host).is_err(), "non-empty bucket");
        map.remove_item(0).unwrap();
        assert_eq!(map.bucket(root).unwrap().weight, WEIGHT_ONE / 2);
        map.finalize().unwrap();
        assert!(map.to_text().contains("item osd.1 weight 0.500"));
    }

    #[test]
    fn erasure_rules_print_as_ceph_writes_them_and_can_be_removed() {
        let mut map = CrushMap::with_default_types();
        let root = map.add_bucket(None, "default", 11, &[]).unwrap();
        let host = map.add_bucket(None, "host0", 1, &[]).unwrap();
        map.insert_item(root, host, 0).unwrap();
        map.add_device(0, "osd.0", None).unwrap();
        map.insert_item(host, 0, WEIGHT_ONE).unwrap();
        map.add_rule(Rule::replicated(0, "replicated_rule", root, 1))
            .unwrap();
        assert_eq!(map.free_rule_id(), 1);
        map.add_rule(Rule::erasure(1, "ec", root, 1)).unwrap();
        map.add_rule(Rule::erasure(2, "ec-osd", root, 0)).unwrap();
        map.finalize().unwrap();
        let text = map.to_text();
        assert!(
            text.contains(
                "rule ec {\n\tid 1\n\ttype erasure\n\tmin_size 3\n\tmax_size 20\n\
                 \tstep set_chooseleaf_tries 5\n\tstep set_choose_tries 100\n\
                 \tstep take default\n\tstep chooseleaf indep 0 type host\n\tstep emit\n}"
            ),
            "{text}"
        );
        assert!(text.contains("\tstep choose indep 0 type osd\n"), "{text}");
        assert_eq!(crate::parse_text(&text).unwrap().to_text(), text);
        assert_eq!(map.remove_rule(1).unwrap().name, "ec");
        assert!(map.remove_rule(1).is_err());
        assert!(map.rule_by_name("ec").is_none());
        assert_eq!(map.free_rule_id(), 1);
    }

    #[test]
    fn weight_conversion_truncates_in_float() {
        assert_eq!(weight_from_f32("4.097".parse().unwrap()), Some(268_501));
        assert_eq!(weight_from_f32("1.819".parse().unwrap()), Some(119_209));
        assert_eq!(weight_from_f32("0.300".parse().unwrap()), Some(19_660));
        assert_eq!(weight_from_f32(1.0), Some(0x10000));
        assert_eq!(weight_from_f32(-1.0), None);
        assert_eq!(format_weight(0x10000), "1.000");
        assert_eq!(format_weight(0x1000), "0.062");
    }
}
