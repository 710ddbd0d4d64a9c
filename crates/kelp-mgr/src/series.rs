//! Time series of client and recovery I/O, in a bounded ring buffer.
//!
//! Why bounded: the manager runs for months; it keeps the last `capacity` samples (at one
//! sample per poll, 2 s, the default 900 are half an hour) and forgets older ones, so its
//! memory does not grow with uptime.

use std::collections::VecDeque;

use serde::Serialize;

/// One poll's rates.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct IoSample {
    /// Unix ms.
    pub t_ms: u64,
    pub read_bytes_sec: u64,
    pub write_bytes_sec: u64,
    pub read_op_per_sec: u64,
    pub write_op_per_sec: u64,
    pub recovering_objects_per_sec: u64,
    pub recovering_bytes_per_sec: u64,
}

#[derive(Debug, Clone)]
pub struct Ring<T> {
    capacity: usize,
    items: VecDeque<T>,
}

impl<T: Clone> Ring<T> {
    pub fn new(capacity: usize) -> Ring<T> {
        Ring {
            capacity: capacity.max(1),
            items: VecDeque::with_capacity(capacity.clamp(1, 4096)),
        }
    }

    /// Adds `item`, dropping the oldest when full.
    pub fn push(&mut self, item: T) {
        if self.items.len() == self.capacity {
            self.items.pop_front();
        }
        self.items.push_back(item);
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// The newest `n` items, oldest first.
    pub fn last(&self, n: usize) -> Vec<T> {
        let skip = self.items.len().saturating_sub(n);
        self.items.iter().skip(skip).cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_keeps_the_newest() {
        let mut r = Ring::new(3);
        for i in 0..10 {
            r.push(i);
        }
        assert_eq!(r.len(), 3);
        assert_eq!(r.last(10), vec![7, 8, 9]);
        assert_eq!(r.last(2), vec![8, 9]);
    }
}
