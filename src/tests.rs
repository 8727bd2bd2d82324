//! `#[pg_test]` unit tests: each runs inside one transaction of a test server, rolled back after.
use pgrx::prelude::*;

#[pg_schema]
mod tests {
    use super::*;

    #[pg_test]
    fn claim_then_duplicate() {
        assert_eq!(Spi::get_one::<bool>("SELECT dedup.try_claim($$a$$)"), Ok(Some(true)));
        assert_eq!(Spi::get_one::<bool>("SELECT dedup.try_claim($$a$$)"), Ok(Some(false)));
    }
}
