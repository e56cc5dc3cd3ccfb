//! A bit-exact port of `java.util.Random`, so the generator reproduces the case study's data.

const MULTIPLIER: u64 = 0x5_DEEC_E66D;
const ADDEND: u64 = 0xB;
const MASK: u64 = (1 << 48) - 1;

#[derive(Debug, Clone)]
pub struct JavaRandom {
    seed: u64,
}

impl JavaRandom {
    /// `new Random(seed)`.
    pub fn new(seed: i64) -> Self {
        Self {
            seed: (seed as u64 ^ MULTIPLIER) & MASK,
        }
    }

    /// The generator's state (48 bits): what [`JavaRandom::from_state`] resumes from.
    pub fn state(&self) -> u64 {
        self.seed
    }

    /// A generator in `state`, as [`JavaRandom::state`] read it; `None` for a value over 48 bits.
    pub fn from_state(state: u64) -> Option<Self> {
        (state <= MASK).then_some(Self { seed: state })
    }

    fn next(&mut self, bits: u32) -> i32 {
        debug_assert!((1..=32).contains(&bits));
        self.seed = self.seed.wrapping_mul(MULTIPLIER).wrapping_add(ADDEND) & MASK;
        (self.seed >> (48 - bits)) as i64 as i32
    }

    pub fn next_int(&mut self) -> i32 {
        self.next(32)
    }

    /// `nextInt(bound)`: the power-of-two shortcut and the rejection loop, as Java documents them.
    pub fn next_int_bounded(&mut self, bound: i32) -> i32 {
        assert!(bound > 0, "bound must be positive");
        if bound & bound.wrapping_neg() == bound {
            return ((i64::from(bound) * i64::from(self.next(31))) >> 31) as i32;
        }
        loop {
            let bits = self.next(31);
            let value = bits % bound;
            if bits.wrapping_sub(value).wrapping_add(bound - 1) >= 0 {
                return value;
            }
        }
    }

    /// Moves on as `next_int_bounded(bound)` would, for a `bound` that is not a power of two, without
    /// computing its value: a draw is taken when it is below the largest multiple of `bound` under
    /// 2^31 (the rejection loop's test, whose overflow says the same).
    pub fn skip_bounded(&mut self, bound: i32) {
        debug_assert!(bound > 0 && bound & bound.wrapping_neg() != bound);
        let accepted_below = (1 << 31) - (1 << 31) % i64::from(bound);
        while i64::from(self.next(31)) >= accepted_below {}
    }

    pub fn next_long(&mut self) -> i64 {
        (i64::from(self.next(32)) << 32).wrapping_add(i64::from(self.next(32)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Expected values printed by OpenJDK 17's java.util.Random.
    #[test]
    fn matches_java_sequences() {
        let draw = |seed: i64, bound: i32, n: usize| -> Vec<i32> {
            let mut random = JavaRandom::new(seed);
            (0..n).map(|_| random.next_int_bounded(bound)).collect()
        };
        assert_eq!(
            draw(1, 200, 8),
            [185, 188, 47, 113, 54, 104, 34, 6],
            "country stream"
        );
        assert_eq!(
            draw(100, 50_000, 8),
            [3915, 26250, 7874, 25988, 14291, 24666, 39036, 37288]
        );
        assert_eq!(draw(10, 20, 8), [13, 0, 13, 10, 6, 16, 17, 8]);
        assert_eq!(draw(7, 16, 6), [11, 10, 11, 0, 5, 7], "power of two bound");
        assert_eq!(
            draw(-5, 1_073_741_825, 8),
            [
                578319411, 780466721, 717457953, 737996328, 817965352, 617011057, 497885393,
                741576374
            ],
            "a bound that makes the rejection loop run often"
        );
        let mut random = JavaRandom::new(42);
        let ints: Vec<i32> = (0..4).map(|_| random.next_int()).collect();
        assert_eq!(ints, [-1170105035, 234785527, -1360544799, 205897768]);
        let mut random = JavaRandom::new(42);
        let longs: Vec<i64> = (0..3).map(|_| random.next_long()).collect();
        assert_eq!(
            longs,
            [
                -5025562857975149833,
                -5843495416241995736,
                5694868678511409995
            ]
        );
        assert_eq!(JavaRandom::new(1).next_int_bounded(1_000_000), 548_985);
    }

    #[test]
    fn a_skipped_draw_leaves_the_state_a_drawn_one_does() {
        // The generator's bounds reject few draws; 1,000,000,007 rejects about 7% of them.
        for bound in [20, 200, 500, 10_000, 50_000, 1_000_000_007] {
            for seed in 0..40 {
                let (mut drawn, mut skipped) = (JavaRandom::new(seed), JavaRandom::new(seed));
                for _ in 0..2_000 {
                    drawn.next_int_bounded(bound);
                    skipped.skip_bounded(bound);
                    assert_eq!(drawn.state(), skipped.state(), "bound {bound} seed {seed}");
                }
            }
        }
    }
}
