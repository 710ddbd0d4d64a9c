//! `do_rule`: maps an input `x` through a rule to an ordered list of devices, exactly as Ceph's
//! `crush_do_rule` does for straw2 maps. Pure: no allocation beyond the caller's scratch, no I/O.
//!
//! Two descent modes exist. `firstn` (replicated pools) fills positions in order and returns a
//! shorter list when it runs out of tries; a failed position shifts later ones left. `indep`
//! (erasure-coded pools) keeps every position stable: a position it cannot fill becomes
//! `ITEM_NONE`, and retries for one position never move another.
//!
//! Hot path: this is what every client op and every PG calculation runs.

use crate::error::{CrushError, Result};
use crate::hash::{LANES, crush_hash32_2, crush_hash32_3_lanes};
use crate::ln::crush_ln;
use crate::map::{Bucket, CrushMap, ITEM_NONE, ITEM_UNDEF, ItemId, Step, WEIGHT_ONE};

/// Reusable buffers for `do_rule_into`, so that mapping many inputs allocates once.
#[derive(Debug, Default, Clone)]
pub struct Scratch {
    w: Vec<ItemId>,
    o: Vec<ItemId>,
    c: Vec<ItemId>,
}

/// Largest replica count a single mapping may ask for.
pub const MAX_NUM_REP: usize = 256;

/// Per-call parameters that the rule's `set_*` steps may change.
struct Knobs {
    choose_tries: u32,
    choose_leaf_tries: u32,
    local_retries: u32,
    vary_r: u32,
    stable: bool,
}

impl CrushMap {
    /// Maps `x` with rule `rule_id` to at most `num_rep` devices. `reweights[osd]` is the 16.16
    /// in/out weight of each device (`0x10000` = in, `0` = out, between = partly out); devices
    /// beyond the vector are out. `firstn` rules may return fewer devices; `indep` rules return
    /// exactly `num_rep` entries with `ITEM_NONE` holes.
    pub fn do_rule(
        &self,
        rule_id: u32,
        x: u32,
        num_rep: usize,
        reweights: &[u32],
    ) -> Result<Vec<ItemId>> {
        let mut out = Vec::with_capacity(num_rep);
        self.do_rule_into(
            rule_id,
            x,
            num_rep,
            reweights,
            &mut out,
            &mut Scratch::default(),
        )?;
        Ok(out)
    }

    /// As `do_rule`, writing into `result` (cleared first) and reusing `scratch`.
    pub fn do_rule_into(
        &self,
        rule_id: u32,
        x: u32,
        num_rep: usize,
        reweights: &[u32],
        result: &mut Vec<ItemId>,
        scratch: &mut Scratch,
    ) -> Result<()> {
        result.clear();
        if !self.finalized {
            return Err(CrushError::Invalid(
                "the map was modified and not finalized before mapping".into(),
            ));
        }
        let rule = self.rule(rule_id).ok_or_else(|| CrushError::NoSuchRule {
            rule: rule_id,
            known: self
                .rules()
                .map(|r| r.id.to_string())
                .collect::<Vec<_>>()
                .join(","),
        })?;
        self.check_mappable(rule)?;
        if num_rep == 0 || num_rep > MAX_NUM_REP {
            return Err(CrushError::BadNumRep {
                num_rep,
                max: MAX_NUM_REP,
            });
        }
        let result_max = num_rep;
        for buf in [&mut scratch.w, &mut scratch.o, &mut scratch.c] {
            buf.clear();
            buf.resize(result_max, 0);
        }
        let (mut w, mut o, mut c) = (
            std::mem::take(&mut scratch.w),
            std::mem::take(&mut scratch.o),
            std::mem::take(&mut scratch.c),
        );
        let t = &self.tunables;
        let mut knobs = Knobs {
            choose_tries: t.choose_total_tries + 1,
            choose_leaf_tries: 0,
            local_retries: t.choose_local_tries,
            vary_r: t.chooseleaf_vary_r,
            stable: t.chooseleaf_stable != 0,
        };
        let mut wsize = 0usize;
        for step in &rule.steps {
            match *step {
                Step::Take(item) => {
                    let valid = if item >= 0 {
                        item < self.max_devices
                    } else {
                        self.bucket(item).is_some()
                    };
                    if valid {
                        w[0] = item;
                        wsize = 1;
                    }
                }
                Step::SetChooseTries(n) if n > 0 => knobs.choose_tries = n as u32,
                Step::SetChooseleafTries(n) if n > 0 => knobs.choose_leaf_tries = n as u32,
                Step::SetChooseLocalTries(n) if n >= 0 => knobs.local_retries = n as u32,
                Step::SetChooseleafVaryR(n) if n >= 0 => knobs.vary_r = n as u32,
                Step::SetChooseleafStable(n) if n >= 0 => knobs.stable = n != 0,
                Step::SetChooseTries(_)
                | Step::SetChooseleafTries(_)
                | Step::SetChooseLocalTries(_)
                | Step::SetChooseLocalFallbackTries(_)
                | Step::SetChooseleafVaryR(_)
                | Step::SetChooseleafStable(_) => {}
                Step::Choose {
                    leaf,
                    indep,
                    num,
                    type_id,
                } => {
                    if wsize == 0 {
                        continue;
                    }
                    let mut osize = 0usize;
                    for &start in &w[..wsize] {
                        let mut numrep = num;
                        if numrep <= 0 {
                            numrep += result_max as i32;
                            if numrep <= 0 {
                                continue;
                            }
                        }
                        // A non-bucket here (a device, or a hole) has nothing to descend into.
                        let Some(bucket) = self.bucket(start) else {
                            continue;
                        };
                        if !indep {
                            let recurse_tries = if knobs.choose_leaf_tries > 0 {
                                knobs.choose_leaf_tries
                            } else if t.chooseleaf_descend_once != 0 {
                                1
                            } else {
                                knobs.choose_tries
                            };
                            let ctx = Descent {
                                map: self,
                                reweights,
                                x,
                                vary_r: knobs.vary_r,
                                stable: knobs.stable,
                                local_retries: knobs.local_retries,
                            };
                            osize += ctx.choose_firstn(
                                bucket,
                                numrep,
                                type_id,
                                &mut o[osize..],
                                0,
                                result_max - osize,
                                knobs.choose_tries,
                                recurse_tries,
                                leaf,
                                Some(&mut c[osize..]),
                                0,
                            );
                        } else {
                            let out_size = (numrep as usize).min(result_max - osize);
                            let ctx = Descent {
                                map: self,
                                reweights,
                                x,
                                vary_r: knobs.vary_r,
                                stable: knobs.stable,
                                local_retries: knobs.local_retries,
                            };
                            ctx.choose_indep(
                                bucket,
                                out_size,
                                numrep,
                                type_id,
                                &mut o[osize..],
                                0,
                                knobs.choose_tries,
                                if knobs.choose_leaf_tries > 0 {
                                    knobs.choose_leaf_tries
                                } else {
                                    1
                                },
                                leaf,
                                Some(&mut c[osize..]),
                                0,
                            );
                            osize += out_size;
                        }
                    }
                    if leaf {
                        o[..osize].copy_from_slice(&c[..osize]);
                    }
                    std::mem::swap(&mut o, &mut w);
                    wsize = osize;
                }
                Step::Emit => {
                    for &item in &w[..wsize] {
                        if result.len() >= result_max {
                            break;
                        }
                        result.push(item);
                    }
                    wsize = 0;
                }
            }
        }
        scratch.w = w;
        scratch.o = o;
        scratch.c = c;
        Ok(())
    }
}

impl CrushMap {
    /// Refuses what the mapper does not implement instead of mapping differently from Ceph:
    /// the legacy `choose_local_fallback_tries` permutation fallback.
    fn check_mappable(&self, rule: &crate::map::Rule) -> Result<()> {
        let mut fallback = self.tunables.choose_local_fallback_tries;
        for step in &rule.steps {
            if let Step::SetChooseLocalFallbackTries(n) = *step {
                if n > 0 {
                    fallback = n as u32;
                    break;
                }
                if n == 0 {
                    fallback = 0;
                }
            }
        }
        if fallback > 0 {
            return Err(CrushError::Unsupported(format!(
                "choose_local_fallback_tries {fallback} (the legacy tunables profile): the \
                 permutation fallback is not implemented; use the optimal tunables \
                 (choose_local_tries 0, choose_local_fallback_tries 0, choose_total_tries 50, \
                 chooseleaf_descend_once 1, chooseleaf_vary_r 1, chooseleaf_stable 1)"
            )));
        }
        Ok(())
    }
}

/// The state shared by one descent: the map, the reweights, the input and the tunables that
/// stay fixed during a `choose` step.
struct Descent<'a> {
    map: &'a CrushMap,
    reweights: &'a [u32],
    x: u32,
    vary_r: u32,
    stable: bool,
    local_retries: u32,
}

impl Descent<'_> {
    /// straw2: every item draws `ln(u) / weight` with `u` a 16-bit hash of (x, item, r); the
    /// largest draw wins (first one on ties). Zero-weight items never win unless all are zero.
    #[inline]
    fn straw2_choose(&self, bucket: &Bucket, r: u32) -> ItemId {
        let mut high = 0usize;
        let mut high_draw = i64::MIN;
        let items = &bucket.items;
        let mut ids = [0u32; LANES];
        let mut base = 0usize;
        while base < items.len() {
            // Hash up to LANES items at once (SIMD), then draw and compare in order.
            let n = (items.len() - base).min(LANES);
            for (slot, &item) in ids.iter_mut().zip(&items[base..base + n]) {
                *slot = item as u32;
            }
            let hashes = crush_hash32_3_lanes(self.x, &ids, r);
            for (lane, &hash) in hashes.iter().enumerate().take(n) {
                let i = base + lane;
                let draw = if bucket.item_weights[i] != 0 {
                    let ln = crush_ln(hash & 0xffff) as i64 - 0x1_0000_0000_0000;
                    bucket.divisors[i].div_neg(ln)
                } else {
                    i64::MIN
                };
                if i == 0 || draw > high_draw {
                    high = i;
                    high_draw = draw;
                }
            }
            base += n;
        }
        items[high]
    }

    /// Whether a chosen device is rejected by its reweight: out at 0, in at >= 1.0, otherwise
    /// kept for the share of inputs whose hash falls under the weight.
    #[inline]
    fn is_out(&self, item: ItemId) -> bool {
        let Some(&weight) = self.reweights.get(item as usize) else {
            return true;
        };
        if weight >= WEIGHT_ONE {
            return false;
        }
        if weight == 0 {
            return true;
        }
        (crush_hash32_2(self.x, item as u32) & 0xffff) >= weight
    }

    fn item_type(&self, item: ItemId) -> Option<u32> {
        if item >= 0 {
            Some(0)
        } else {
            self.map.bucket(item).map(|b| b.type_id)
        }
    }

    /// Chooses up to `numrep` distinct items of `type_id` below `bucket`, writing them to
    /// `out[outpos..]`; with `recurse_to_leaf`, also one device under each into `out2`.
    /// Returns the new `outpos`.
    #[allow(clippy::too_many_arguments)]
    fn choose_firstn(
        &self,
        bucket: &Bucket,
        numrep: i32,
        type_id: u32,
        out: &mut [ItemId],
        mut outpos: usize,
        out_size: usize,
        tries: u32,
        recurse_tries: u32,
        recurse_to_leaf: bool,
        mut out2: Option<&mut [ItemId]>,
        parent_r: u32,
    ) -> usize {
        let mut count = out_size;
        let mut rep: i32 = if self.stable { 0 } else { outpos as i32 };
        while rep < numrep && count > 0 {
            let mut ftotal: u32 = 0;
            let mut skip_rep = false;
            let mut item: ItemId = 0;
            loop {
                // one descent from the top bucket
                let mut retry_descent = false;
                let mut inb = bucket;
                let mut flocal: u32 = 0;
                loop {
                    // one choice within `inb`
                    let r = (rep as u32).wrapping_add(parent_r).wrapping_add(ftotal);
                    let mut collide = false;
                    let mut reject = false;
                    let mut retry_bucket = false;
                    if inb.items.is_empty() {
                        reject = true;
                    } else {
                        item = self.straw2_choose(inb, r);
                        if item >= self.map.max_devices {
                            skip_rep = true;
                            break;
                        }
                        let Some(itemtype) = self.item_type(item) else {
                            skip_rep = true;
                            break;
                        };
                        if itemtype != type_id {
                            match self.map.bucket(item) {
                                Some(child) if item < 0 => {
                                    inb = child;
                                    continue;
                                }
                                _ => {
                                    skip_rep = true;
                                    break;
                                }
                            }
                        }
                        collide = out[..outpos].contains(&item);
                        if !collide && recurse_to_leaf {
                            if item < 0 {
                                let sub_r = if self.vary_r != 0 {
                                    r >> (self.vary_r - 1)
                                } else {
                                    0
                                };
                                let child = self.map.bucket(item).expect("type checked above");
                                let leaves = out2.as_deref_mut().expect("leaf buffer");
                                let placed = self.choose_firstn(
                                    child,
                                    if self.stable { 1 } else { outpos as i32 + 1 },
                                    0,
                                    leaves,
                                    outpos,
                                    count,
                                    recurse_tries,
                                    0,
                                    false,
                                    None,
                                    sub_r,
                                );
                                if placed <= outpos {
                                    reject = true;
                                }
                            } else if let Some(leaves) = out2.as_deref_mut() {
                                leaves[outpos] = item;
                            }
                        }
                        if !reject && !collide && itemtype == 0 {
                            reject = self.is_out(item);
                        }
                    }
                    if reject || collide {
                        ftotal += 1;
                        flocal += 1;
                        if collide && flocal <= self.local_retries {
                            retry_bucket = true;
                        } else if ftotal < tries {
                            retry_descent = true;
                        } else {
                            skip_rep = true;
                        }
                    }
                    if !retry_bucket {
                        break;
                    }
                }
                if !retry_descent {
                    break;
                }
            }
            if !skip_rep {
                out[outpos] = item;
                outpos += 1;
                count -= 1;
            }
            rep += 1;
        }
        outpos
    }

    /// Fills positions `outpos..outpos+left` of `out` with distinct items of `type_id` below
    /// `bucket`, each position independent of the others; unfillable positions become
    /// `ITEM_NONE`.
    #[allow(clippy::too_many_arguments)]
    fn choose_indep(
        &self,
        bucket: &Bucket,
        left: usize,
        numrep: i32,
        type_id: u32,
        out: &mut [ItemId],
        outpos: usize,
        tries: u32,
        recurse_tries: u32,
        recurse_to_leaf: bool,
        mut out2: Option<&mut [ItemId]>,
        parent_r: u32,
    ) {
        let endpos = outpos + left;
        let mut left = left;
        for rep in outpos..endpos {
            out[rep] = ITEM_UNDEF;
            if let Some(o2) = out2.as_deref_mut() {
                o2[rep] = ITEM_UNDEF;
            }
        }
        let mut ftotal: u32 = 0;
        while left > 0 && ftotal < tries {
            for rep in outpos..endpos {
                if out[rep] != ITEM_UNDEF {
                    continue;
                }
                let mut inb = bucket;
                loop {
                    // Positions keep their own r, so a retry for one never moves another.
                    let r = (rep as u32)
                        .wrapping_add(parent_r)
                        .wrapping_add((numrep as u32).wrapping_mul(ftotal));
                    if inb.items.is_empty() {
                        break;
                    }
                    let item = self.straw2_choose(inb, r);
                    let itemtype = if item < self.map.max_devices {
                        self.item_type(item)
                    } else {
                        None
                    };
                    let Some(itemtype) = itemtype else {
                        out[rep] = ITEM_NONE;
                        if let Some(o2) = out2.as_deref_mut() {
                            o2[rep] = ITEM_NONE;
                        }
                        left -= 1;
                        break;
                    };
                    if itemtype != type_id {
                        match self.map.bucket(item) {
                            Some(child) if item < 0 => {
                                inb = child;
                                continue;
                            }
                            _ => {
                                out[rep] = ITEM_NONE;
                                if let Some(o2) = out2.as_deref_mut() {
                                    o2[rep] = ITEM_NONE;
                                }
                                left -= 1;
                                break;
                            }
                        }
                    }
                    if out[outpos..endpos].contains(&item) {
                        break;
                    }
                    if recurse_to_leaf {
                        let leaves = out2.as_deref_mut().expect("leaf buffer");
                        if item < 0 {
                            let child = self.map.bucket(item).expect("type checked above");
                            self.choose_indep(
                                child,
                                1,
                                numrep,
                                0,
                                leaves,
                                rep,
                                recurse_tries,
                                0,
                                false,
                                None,
                                r,
                            );
                            if leaves[rep] == ITEM_NONE {
                                break;
                            }
                        } else {
                            leaves[rep] = item;
                        }
                    }
                    if itemtype == 0 && self.is_out(item) {
                        break;
                    }
                    out[rep] = item;
                    left -= 1;
                    break;
                }
            }
            ftotal += 1;
        }
        for rep in outpos..endpos {
            if out[rep] == ITEM_UNDEF {
                out[rep] = ITEM_NONE;
            }
            if let Some(o2) = out2.as_deref_mut()
                && o2[rep] == ITEM_UNDEF
            {
                o2[rep] = ITEM_NONE;
            }
        }
    }
}
