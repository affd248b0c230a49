//! tandem's backend conformance suite
