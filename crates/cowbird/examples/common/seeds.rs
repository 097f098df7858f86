//! The campaigns' seed range: `END [START]` on the command line
//! (defaults 100 and 0).

/// `(first, end)`: seeds `first..end`.
pub fn seed_range() -> (u64, u64) {
    let argument = |index: usize, default: u64| -> u64 {
        std::env::args()
            .nth(index)
            .and_then(|text| text.parse().ok())
            .unwrap_or(default)
    };
    (argument(2, 0), argument(1, 100))
}
