//! Where an image's bytes live: the mapping from image offsets to data objects.
//!
//! An image is cut into data objects of `2^order` bytes. Without striping (`stripe_unit` equal
//! to the object size, `stripe_count` 1) image byte `x` is in object `x >> order` at offset
//! `x % object_size`. With striping, consecutive stripe units go round-robin over
//! `stripe_count` objects (an *object set*); when each object of the set is full the next set
//! starts — Ceph's file layout, so the same image geometry means the same objects.

use serde::{Deserialize, Serialize};

use crate::RbdError;

/// Smallest and largest object size: 4 KiB and 32 MiB (`order` 12..=25).
pub const MIN_ORDER: u8 = 12;
pub const MAX_ORDER: u8 = 25;
/// The default object size, 4 MiB.
pub const DEFAULT_ORDER: u8 = 22;

/// An image's geometry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Layout {
    pub order: u8,
    pub stripe_unit: u64,
    pub stripe_count: u64,
}

/// A piece of an I/O that falls in one object: `len` bytes at `offset` in object `object`,
/// which are image bytes `image_offset..image_offset + len` (one stripe unit at most, so the
/// image range is contiguous).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ObjectExtent {
    pub object: u64,
    pub offset: u64,
    pub len: u64,
    pub image_offset: u64,
}

impl Layout {
    /// A plain layout: objects of `2^order` bytes, no striping.
    pub fn plain(order: u8) -> Result<Layout, RbdError> {
        Layout::new(order, None, None)
    }

    /// Checks a geometry: `stripe_unit` divides the object size and is at least 4 KiB (or the
    /// object size), `stripe_count` ≥ 1. Unset values mean "no striping".
    pub fn new(
        order: u8,
        stripe_unit: Option<u64>,
        stripe_count: Option<u64>,
    ) -> Result<Layout, RbdError> {
        if !(MIN_ORDER..=MAX_ORDER).contains(&order) {
            return Err(RbdError::Invalid(format!(
                "object size 2^{order} bytes is outside 4 KiB..32 MiB (order {MIN_ORDER}..={MAX_ORDER})"
            )));
        }
        let object_size = 1u64 << order;
        let stripe_unit = stripe_unit.unwrap_or(object_size);
        let stripe_count = stripe_count.unwrap_or(1);
        if stripe_unit == 0 || !object_size.is_multiple_of(stripe_unit) || stripe_unit < 4096 {
            return Err(RbdError::Invalid(format!(
                "stripe unit {stripe_unit} must be at least 4096 and divide the object size {object_size}"
            )));
        }
        if !(1..=4096).contains(&stripe_count) {
            return Err(RbdError::Invalid(format!(
                "stripe count {stripe_count} must be 1..=4096"
            )));
        }
        Ok(Layout {
            order,
            stripe_unit,
            stripe_count,
        })
    }

    pub fn object_size(&self) -> u64 {
        1u64 << self.order
    }

    pub fn is_striped(&self) -> bool {
        self.stripe_count > 1 && self.stripe_unit < self.object_size()
    }

    /// How many data objects an image of `size` bytes can touch (the highest object number + 1).
    pub fn object_count(&self, size: u64) -> u64 {
        if size == 0 {
            return 0;
        }
        let su = self.stripe_unit;
        let sc = self.stripe_count;
        let set_bytes = self.object_size() * sc;
        let full_sets = size / set_bytes;
        let rest = size % set_bytes;
        let in_last = if rest == 0 {
            0
        } else {
            // Stripe units in the partial set go round-robin: the first `min(units, sc)` objects.
            rest.div_ceil(su).min(sc)
        };
        full_sets * sc + in_last
    }

    /// The object extents of image range `offset..offset + len`, in image order.
    pub fn map(&self, offset: u64, len: u64) -> Vec<ObjectExtent> {
        let mut out = Vec::new();
        let su = self.stripe_unit;
        let sc = self.stripe_count;
        let units_per_object = self.object_size() / su;
        let mut pos = offset;
        let end = offset.saturating_add(len);
        while pos < end {
            let unit = pos / su;
            let in_unit = pos % su;
            let take = (su - in_unit).min(end - pos);
            let stripe = unit / sc;
            let stripe_pos = unit % sc;
            let set = stripe / units_per_object;
            let object = set * sc + stripe_pos;
            let object_offset = (stripe % units_per_object) * su + in_unit;
            match out.last_mut() {
                // Unstriped layouts: merge the units of one object into one extent.
                Some(ObjectExtent {
                    object: o,
                    offset: off,
                    len: l,
                    image_offset: io,
                }) if *o == object && *off + *l == object_offset && *io + *l == pos => {
                    *l += take;
                }
                _ => out.push(ObjectExtent {
                    object,
                    offset: object_offset,
                    len: take,
                    image_offset: pos,
                }),
            }
            pos += take;
        }
        out
    }

    /// The image offset of byte `offset` of object `object` (the inverse of [`Layout::map`]).
    pub fn image_offset(&self, object: u64, offset: u64) -> u64 {
        let su = self.stripe_unit;
        let sc = self.stripe_count;
        let units_per_object = self.object_size() / su;
        let set = object / sc;
        let stripe_pos = object % sc;
        let stripe = set * units_per_object + offset / su;
        (stripe * sc + stripe_pos) * su + offset % su
    }

    /// How many bytes at the start of object `object` hold image bytes below `size` (its units
    /// fill in order, so they are a prefix of the object).
    pub fn object_len(&self, object: u64, size: u64) -> u64 {
        self.object_ranges(object, size)
            .iter()
            .map(|(_, l)| l)
            .sum()
    }

    /// The image ranges `(image_offset, len)` that object `object` holds, within `0..size`, in
    /// object order (one per stripe unit when striped, else one).
    pub fn object_ranges(&self, object: u64, size: u64) -> Vec<(u64, u64)> {
        let su = self.stripe_unit;
        let mut out: Vec<(u64, u64)> = Vec::new();
        let mut off = 0;
        while off < self.object_size() {
            let start = self.image_offset(object, off);
            if start >= size {
                break;
            }
            let len = su.min(size - start);
            match out.last_mut() {
                Some((s, l)) if *s + *l == start => *l += len,
                _ => out.push((start, len)),
            }
            off += su;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn plain_layout_maps_by_object_size() {
        let l = Layout::plain(22).unwrap();
        let m = l.map((4 << 20) - 10, 20);
        assert_eq!(
            m,
            vec![
                ObjectExtent {
                    object: 0,
                    offset: (4 << 20) - 10,
                    len: 10,
                    image_offset: (4 << 20) - 10
                },
                ObjectExtent {
                    object: 1,
                    offset: 0,
                    len: 10,
                    image_offset: 4 << 20
                },
            ]
        );
        assert_eq!(l.object_count(0), 0);
        assert_eq!(l.object_count(1), 1);
        assert_eq!(l.object_count(8 << 20), 2);
        assert_eq!(l.object_count((8 << 20) + 1), 3);
    }

    #[test]
    fn striped_layout_goes_round_robin() {
        // 16 KiB objects of 4 KiB units over 3 objects: an object set holds 48 KiB.
        let l = Layout::new(14, Some(4096), Some(3)).unwrap();
        let objs: Vec<u64> = (0..8).map(|u| l.map(u * 4096, 1)[0].object).collect();
        assert_eq!(objs, [0, 1, 2, 0, 1, 2, 0, 1]);
        assert_eq!(l.map(3 * 4096, 1)[0].offset, 4096);
        // the second object set starts after 12 units
        assert_eq!(l.map(12 * 4096, 1)[0].object, 3);
        assert_eq!(l.object_count(12 * 4096), 3);
        assert_eq!(l.object_count(12 * 4096 + 1), 4);
        assert_eq!(l.object_count(4096 + 1), 2);
    }

    #[test]
    fn bad_geometries_are_refused() {
        assert!(Layout::plain(11).is_err());
        assert!(Layout::plain(26).is_err());
        assert!(Layout::new(22, Some(3000), Some(2)).is_err());
        assert!(Layout::new(22, Some(1 << 23), Some(2)).is_err());
        assert!(Layout::new(22, Some(65536), Some(0)).is_err());
    }

    proptest! {
        #[test]
        fn map_covers_the_range_once_and_inverts(
            order in 12u8..18, su_shift in 12u8..18, sc in 1u64..5,
            offset in 0u64..(1 << 22), len in 0u64..(1 << 20)
        ) {
            let su = 1u64 << su_shift.min(order);
            let l = Layout::new(order, Some(su), Some(sc)).unwrap();
            let m = l.map(offset, len);
            prop_assert_eq!(m.iter().map(|e| e.len).sum::<u64>(), len);
            let mut pos = offset;
            for e in &m {
                prop_assert_eq!(e.image_offset, pos);
                prop_assert!(e.offset + e.len <= l.object_size());
                prop_assert_eq!(l.image_offset(e.object, e.offset), e.image_offset);
                pos += e.len;
            }
            // every object touched is below object_count of the end
            for e in &m {
                prop_assert!(e.object < l.object_count(offset + len));
            }
        }

        #[test]
        fn object_ranges_partition_the_image(order in 12u8..16, su_shift in 12u8..16, sc in 1u64..4, size in 1u64..(1 << 20)) {
            let su = 1u64 << su_shift.min(order);
            let l = Layout::new(order, Some(su), Some(sc)).unwrap();
            let mut total = 0;
            for o in 0..l.object_count(size) {
                for (s, n) in l.object_ranges(o, size) {
                    prop_assert!(s + n <= size);
                    total += n;
                }
            }
            prop_assert_eq!(total, size);
        }
    }
}
