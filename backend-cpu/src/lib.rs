//! tandem's CPU reference backend
