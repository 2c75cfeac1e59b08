//! A small seeded generator for the suites' generated waves and the chaos schedules: a fixed
//! seed gives the same sequence on every run and every machine.

/// splitmix64: a fixed seed gives the same wave on every run.
#[derive(Clone, Debug)]
pub struct Rng(pub u64);

impl Rng {
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// In `lo..=hi` (`lo` when `hi < lo`). Draws one number either way, so a sequence does not
    /// shift with the bounds.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        let x = self.next_u64();
        if hi <= lo {
            return lo;
        }
        lo + x % (hi - lo + 1)
    }

    /// One of `from` (which must not be empty).
    pub fn pick<'a>(&mut self, from: &[&'a str]) -> &'a str {
        from[(self.next_u64() % from.len() as u64) as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_gives_the_same_sequence_and_ranges_hold() {
        let a: Vec<u64> = (0..5).scan(Rng(7), |r, _| Some(r.next_u64())).collect();
        let b: Vec<u64> = (0..5).scan(Rng(7), |r, _| Some(r.next_u64())).collect();
        assert_eq!(a, b);
        let mut r = Rng(1);
        for _ in 0..1000 {
            let v = r.range(3, 5);
            assert!((3..=5).contains(&v));
        }
        assert_eq!(r.range(4, 4), 4);
        assert_eq!(r.range(9, 2), 9);
    }
}
